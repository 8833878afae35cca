// cpu/store_kv.cpp: writes new K/V rows into their cache slots (contiguous or paged), as f16 or
// as q8_0 blocks.
#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "cpu/parallel.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember::cpu {

void f32_to_f16_row_scalar(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim, const float* k,
              const float* v, const OpKernels& kernels, ThreadPool& pool) {
  const int64_t grain = 16384 / n_kv_dim + 1;
  const int64_t head_dim = n_kv_dim / kv.n_head_kv;
  // Row r's kv heads, each to its place in the block of its position (KVView's layout).
  auto store_heads = [&](auto&& write) {
    parallel_for(pool, n_rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t h = 0; h < kv.n_head_kv; ++h) {
          const int64_t at = kv.offset(positions[r], h), from = r * n_kv_dim + h * head_dim;
          write(k + from, kv.k + at, head_dim);
          write(v + from, kv.v + at, head_dim);
        }
      }
    });
  };
  const OpKernels& rows = kernels.for_rows(head_dim);
  if (kv.type == DType::q8_0) {
    // gguf-py's bytes, from the reference quantizer or a byte-identical SIMD twin.
    const auto quantize = rows.quantize_row_q8_0;
    return store_heads([&](const float* src, uint8_t* dst, int64_t n) { quantize(src, dst, n); });
  }
  const auto convert = rows.f32_to_f16_row;
  store_heads(
      [&](const float* src, uint8_t* dst, int64_t n) { convert(src, reinterpret_cast<uint16_t*>(dst), n); });
}

}  // namespace ember::cpu
