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
              const float* v, const OpsIsa& isa, ThreadPool& pool) {
  const int64_t grain = 16384 / n_kv_dim + 1;
  if (kv.type == DType::q8_0) {
    // gguf-py's bytes, from the reference quantizer or its byte-identical AVX2 twin.
#if EMBER_HAS_X86
    const auto quantize = isa.avx2_f16c ? quantize_row_q8_0_avx2 : quantize_row_q8_0;
#else
    const auto quantize = quantize_row_q8_0;
#endif
    parallel_for(pool, n_rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t slot = kv.slot(positions[r]);
        quantize(k + r * n_kv_dim, kv.k + slot * kv.row_bytes, n_kv_dim);
        quantize(v + r * n_kv_dim, kv.v + slot * kv.row_bytes, n_kv_dim);
      }
    });
    return;
  }
#if EMBER_HAS_X86
  const auto convert = isa.avx2_f16c && n_kv_dim % 8 == 0 ? f32_to_f16_row_avx2 : f32_to_f16_row_scalar;
#else
  const auto convert = f32_to_f16_row_scalar;
#endif
  parallel_for(pool, n_rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t slot = kv.slot(positions[r]);
      convert(k + r * n_kv_dim, reinterpret_cast<uint16_t*>(kv.k + slot * kv.row_bytes), n_kv_dim);
      convert(v + r * n_kv_dim, reinterpret_cast<uint16_t*>(kv.v + slot * kv.row_bytes), n_kv_dim);
    }
  });
}

}  // namespace ember::cpu
