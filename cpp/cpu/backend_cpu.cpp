// cpu/backend_cpu.cpp: CpuBackend forwards each op to its cpu/ implementation on its own pool.
#include "cpu/backend_cpu.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/matmul_kernels.h"
#include "cpu/op_kernels.h"

namespace ember {

CpuBackend::CpuBackend(int n_threads)
    : pool_(n_threads > 0 ? n_threads : ThreadPool::default_n_threads()),
      op_kernels_(cpu::active_op_kernels()) {}

bool CpuBackend::supports(Op op, DType dtype) const {
  switch (op) {
    case Op::matmul: return cpu::matmul_supports(dtype);
    case Op::get_rows: return type_traits(dtype).dequantize_row != nullptr;
    case Op::store_kv:
    case Op::attention: return dtype == DType::f16 || dtype == DType::q8_0;  // the KV cache's type
    default: return dtype == DType::f32;
  }
}

Buffer CpuBackend::alloc(size_t n_bytes) {
  // Blocks of a huge page or more (repacked weights, KV caches) start on a huge-page boundary and
  // ask for their whole huge pages to be backed by them where the kernel leaves it to the program
  // (transparent_hugepage=madvise): streaming a weight matrix then misses the TLB once per 2 MiB
  // instead of once per 4 KiB, and committing it takes one page fault per 2 MiB. The tail past the
  // last whole huge page keeps small pages, so no block commits more memory than it uses.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = n_bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (n_bytes + align - 1) / align * align;
  // Large blocks come from fresh mmap'd pages, so memory is committed only where it is written.
  void* data = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (!data) throw Error(cat("[cpu] out of memory allocating ", n_bytes, " bytes"));
  // Advice: failure is harmless.
  if (align == kHugePage) madvise(data, n_bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  return Buffer(this, data, n_bytes, /*owned=*/true);
}

Buffer CpuBackend::wrap_host(const void* data, size_t n_bytes) {
  return Buffer(this, const_cast<void*>(data), n_bytes, /*owned=*/false);
}

Buffer CpuBackend::prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) {
  const cpu::IsaKernels& kernels = cpu::active_kernels();
  if (kernels.of(wtype).pack == nullptr) {
    return wrap_host(data, static_cast<size_t>(row_bytes(wtype, n_in) * n_out));
  }
  const size_t n_bytes = static_cast<size_t>(cpu::packed_weight_bytes(wtype, n_in, n_out));
  void* packed = alloc_weight(n_bytes);
  cpu::pack_matmul_weight(kernels, wtype, data, n_in, n_out, packed, pool_);
  return Buffer(this, packed, n_bytes, /*owned=*/false);
}

void* CpuBackend::alloc_weight(size_t n_bytes) {
  // Repacked weights lie end to end in chunks of whole huge pages (alloc()), so that every one of
  // them streams from huge pages, where one to a block would leave the small ones (a small
  // model's every matrix, a 1.1B's k and v) and every block's tail past its last whole huge page
  // on 4 KiB pages. A chunk's pages are committed as the packers write them; the arena lives as
  // long as the backend (a model's).
  constexpr size_t kChunk = size_t{64} << 20, kAlign = 64;
  const size_t need = (n_bytes + kAlign - 1) / kAlign * kAlign;
  if (weight_chunks_.empty() || chunk_used_ + need > weight_chunks_.back().n_bytes()) {
    weight_chunks_.push_back(alloc(std::max(kChunk, need)));
    chunk_used_ = 0;
  }
  void* at = weight_chunks_.back().as<uint8_t>() + chunk_used_;
  chunk_used_ += need;
  return at;
}

void CpuBackend::upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) {
  std::memcpy(static_cast<uint8_t*>(dst.data()) + offset, src, n_bytes);
}

void CpuBackend::download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) {
  std::memcpy(dst, static_cast<const uint8_t*>(src.data()) + offset, n_bytes);
}

void CpuBackend::free_buffer(void* data, size_t) { std::free(data); }

int64_t CpuBackend::matmul_exact_min_rows(DType wtype) const { return cpu::matmul_exact_min_rows(wtype); }

void CpuBackend::reserve_matmul(int64_t max_rows, int64_t max_n_in) {
  matmul_workspace_.reserve(cpu::matmul_workspace_bytes(max_rows, max_n_in, pool_.n_threads()));
}

void CpuBackend::matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x,
                        int64_t n_rows, float* y) {
  cpu::matmul(wtype, w, n_in, n_out, x, n_rows, y, pool_, matmul_workspace_);
}

void CpuBackend::matmul_many(const MatmulOut* outs, int n_outs, int64_t n_in, const float* x,
                             int64_t n_rows) {
  cpu::matmul_many(outs, n_outs, n_in, x, n_rows, pool_, matmul_workspace_);
}

void CpuBackend::get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids,
                          float* y) {
  cpu::get_rows(type, table, n_cols, ids, n_ids, y, pool_);
}

void CpuBackend::rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps,
                          float* y) {
  cpu::rms_norm(x, weight, n_rows, n_cols, eps, y, pool_);
}

void CpuBackend::layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows,
                            int64_t n_cols, float eps, float* y) {
  cpu::layer_norm(x, weight, bias, n_rows, n_cols, eps, y, pool_);
}

void CpuBackend::rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
                      const RopeParams& params) {
  cpu::rope(x, n_rows, n_heads, head_dim, positions, params, pool_);
}

void CpuBackend::add(const float* a, const float* b, int64_t n, float* y) { cpu::add(a, b, n, y, pool_); }

void CpuBackend::add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols) {
  cpu::add_bias(x, bias, n_rows, n_cols, pool_);
}

void CpuBackend::silu_mul(const float* gate, const float* up, int64_t n, float* y) {
  cpu::silu_mul(gate, up, n, y, op_kernels_, pool_);
}

void CpuBackend::swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit,
                            float* y) {
  cpu::swiglu_oai(gate, up, n, alpha, limit, y, pool_);
}

void CpuBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* y) {
  cpu::gelu_mul(gate, up, n, y, pool_);
}

void CpuBackend::gelu(const float* x, int64_t n, float* y) { cpu::gelu(x, n, y, pool_); }

void CpuBackend::scale(float* x, int64_t n, float s) { cpu::scale(x, n, s, pool_); }
void CpuBackend::softcap(float* x, int64_t n, float cap) { cpu::softcap(x, n, cap, pool_); }

void CpuBackend::add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids,
                                 int64_t n_cols, float* y) {
  cpu::add_rows_scaled(x, ids, scales, n_ids, n_cols, y, pool_);
}

void CpuBackend::add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                              const float* x, int64_t n_in, const LowRankScratch& scratch) {
  cpu::add_low_rank(groups, n_groups, outs, n_outs, x, n_in, scratch, pool_, matmul_workspace_);
}

void CpuBackend::softmax(float* x, int64_t n_rows, int64_t n_cols) { cpu::softmax(x, n_rows, n_cols, pool_); }

void CpuBackend::copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) {
  cpu::copy_kv(kv, src_block, dst_block, n_slots);
}

void CpuBackend::store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim,
                          const float* k, const float* v) {
  cpu::store_kv(kv, positions, n_rows, n_kv_dim, k, v, op_kernels_, pool_);
}

void CpuBackend::attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                           const AttentionParams& params, float* out) {
  cpu::attention(q, positions, n_rows, kv, params, out, op_kernels_, pool_);
}

}  // namespace ember
