// cpu/attention_avx512.cpp: attention_block with AVX-512 conversions and sums of p·v: 16 values
// per instruction, each value's sum over the keys formed in the same order as the AVX2 kernel's,
// and the AVX2 scores and exponentials. Its results are the AVX2 kernel's bit for bit, so the
// ISA levels agree and no model's output moves (greedy ties in small models flip on any change
// of rounding). Compiled with AVX-512 flags and called only behind OpsIsa::avx512.
#include <immintrin.h>

#include <cstdint>

#include "cpu/attention_avx2.h"
#include "cpu/attention_block.h"
#include "cpu/op_kernels.h"

namespace ember::cpu {

namespace {

// f16 rows converted 16 values at a time (the same values: the conversion is exact; masked, as
// GCC 12 warns of the unmasked intrinsics' internal undefined operands; so below).
struct F16Rows16 : F16Rows {
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(
                                    0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
    if (i < n) F16Rows::to_f32(src + 2 * i, dst + i, n - i);
  }
};

struct Avx512Isa : Avx2Isa {
  // Keys 2p and 2p + 1 of the tile interleaved 8 values at a time, so that one 16-lane FMA does
  // the 8-lane step of Avx2Isa::scores for both: paired[p * 2 hd + 16 c + 8 e + l] = key 2p + e's
  // value 8 c + l.
  static constexpr bool kPairedKeys = true;
  static void pair_keys(const float* keys, int64_t n, int64_t hd, float* paired) {
    for (int64_t j = 0; j < n; ++j) {
      const float* src = keys + j * hd;
      float* dst = paired + (j / 2) * 2 * hd + 8 * (j % 2);
      for (int64_t c = 0; c < hd / 8; ++c) _mm256_store_ps(dst + 16 * c, _mm256_load_ps(src + 8 * c));
    }
  }
  // Avx2Isa::scores's arithmetic (each key's 8 partial sums over d in order, then its horizontal
  // sums of four keys), two keys per instruction where a group of four starts at an even key.
  static float scores_paired(const float* q, const float* keys, const float* paired, int64_t j0,
                             int64_t n_keys, int64_t hd, float* score) {
    return scores_by_fours(q, keys + j0 * hd, n_keys, hd, score, [&](int64_t j, __m256(&dot)[4]) {
      const int64_t a = j0 + j;
      if (a % 2 != 0) return dots4(q, keys + a * hd, hd, dot);
      const float* p0 = paired + (a / 2) * 2 * hd;
      const float* p1 = p0 + 2 * hd;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0;
      for (int64_t c = 0; c < hd / 8; ++c) {
        const __m512 qv = _mm512_maskz_broadcast_f32x8(0xffff, _mm256_load_ps(q + 8 * c));
        s0 = _mm512_fmadd_ps(qv, _mm512_load_ps(p0 + 16 * c), s0);
        s1 = _mm512_fmadd_ps(qv, _mm512_load_ps(p1 + 16 * c), s1);
      }
      dot[0] = _mm512_maskz_extractf32x8_ps(0xff, s0, 0);
      dot[1] = _mm512_maskz_extractf32x8_ps(0xff, s0, 1);
      dot[2] = _mm512_maskz_extractf32x8_ps(0xff, s1, 0);
      dot[3] = _mm512_maskz_extractf32x8_ps(0xff, s1, 1);
    });
  }
  // acc[d] = fma(p[j], values[j][d], acc[d]) for j = 0, 1, ... in order, as Avx2Isa::accumulate
  // does 8 values at a time.
  static void accumulate(const float* p, const float* values, int64_t n, int64_t hd, float* acc) {
    int64_t d = 0;
    for (; d + 64 <= hd; d += 64) {  // 4 vectors of columns: 4 independent chains over keys
      __m512 a0 = _mm512_loadu_ps(acc + d), a1 = _mm512_loadu_ps(acc + d + 16);
      __m512 a2 = _mm512_loadu_ps(acc + d + 32), a3 = _mm512_loadu_ps(acc + d + 48);
      for (int64_t j = 0; j < n; ++j) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const float* v = values + j * hd + d;
        a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v), a0);
        a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16), a1);
        a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 32), a2);
        a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 48), a3);
      }
      _mm512_storeu_ps(acc + d, a0);
      _mm512_storeu_ps(acc + d + 16, a1);
      _mm512_storeu_ps(acc + d + 32, a2);
      _mm512_storeu_ps(acc + d + 48, a3);
    }
    for (; d + 16 <= hd; d += 16) {
      __m512 a = _mm512_loadu_ps(acc + d);
      for (int64_t j = 0; j < n; ++j)
        a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(values + j * hd + d), a);
      _mm512_storeu_ps(acc + d, a);
    }
    if (d < hd) {  // head_dim % 16 == 8
      __m256 a = _mm256_loadu_ps(acc + d);
      for (int64_t j = 0; j < n; ++j)
        a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(values + j * hd + d), a);
      _mm256_storeu_ps(acc + d, a);
    }
  }
};

}  // namespace

void attention_block_avx512(const AttentionBlock& block, const KVView& kv) {
  if (kv.type == DType::q8_0) return attention_block<Avx512Isa, Q8Rows>(block, kv);
  attention_block<Avx512Isa, F16Rows16>(block, kv);
}

}  // namespace ember::cpu
