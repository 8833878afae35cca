// cpu/x86/attention_avx2.cpp: AVX2/FMA/F16C variants of the attention and KV-store inner kernels,
// over f16 or q8_0 cache rows. Compiled with ISA flags and called only behind
// the avx2 and avx512 op tables (op_kernels.h). Shared helpers come from math_avx2.h (internal linkage), so
// no AVX2 code can leak into callers on older CPUs.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/attention_block.h"
#include "cpu/op_kernels.h"
#include "cpu/x86/attention_avx2.h"
#include "cpu/x86/math_avx2.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember::cpu {

void attention_block_avx2(const AttentionBlock& block, const KVView& kv) {
  if (kv.type == DType::q8_0) return attention_block<Avx2Isa, Q8Rows>(block, kv);
  attention_block<Avx2Isa, F16Rows>(block, kv);
}

void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
}

}  // namespace ember::cpu

namespace ember::cpu {

void quantize_row_q8_0_avx2(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    __m256 x[4], amax = _mm256_setzero_ps(), non_finite = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_loadu_ps(src + 8 * i);
      const __m256 a = _mm256_andnot_ps(sign_bit, x[i]);
      amax = _mm256_max_ps(amax, a);
      non_finite = _mm256_or_ps(non_finite, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
    }
    const float d = hmax_avx2(amax) / 127.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    // inf / NaN inputs, or a d so small that 1/d overflows: the reference's NaN and cast rules.
    if (_mm256_movemask_ps(non_finite) != 0 || !(id < INFINITY)) {
      quantize_row_q8_0(src, blocks + b, kQK);
      continue;
    }
    blocks[b].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 id_v = _mm256_set1_ps(id), two = _mm256_set1_ps(2.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      // np_roundf: sign(v) * (floor(|v|) + floor(2 * (|v| - floor(|v|)))), |v| <= 127.
      const __m256 v = _mm256_mul_ps(x[i], id_v);
      const __m256 a = _mm256_andnot_ps(sign_bit, v);
      const __m256 floored = _mm256_floor_ps(a);
      const __m256 rounded = _mm256_add_ps(floored,
                                           _mm256_floor_ps(_mm256_mul_ps(two, _mm256_sub_ps(a, floored))));
      q[i] = _mm256_cvttps_epi32(_mm256_or_ps(rounded, _mm256_and_ps(v, sign_bit)));
    }
    // int32 x 32 -> int8 x 32 (no saturation happens: |q| <= 127); packs interleave 128-bit lanes.
    const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i q8 = _mm256_permutevar8x32_epi32(q16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blocks[b].qs), q8);
  }
}

}  // namespace ember::cpu
