// cpu/x86/attention_avx2.h: the AVX2 primitives of attention_block (attention_block.h) and the KV
// row formats they read, shared by attention_avx2.cpp and attention_avx512.cpp (whose pair
// primitives must give these bits). Include it only from files compiled with AVX2 flags:
// everything here has internal linkage (see math_avx2.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/x86/math_avx2.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember::cpu {
namespace {

// The KV row formats (scalar twins in attention.cpp): a head's values as f32 — 8 at a time in a
// register, or n at a time into memory. A head's vectors come in groups of kGroup that share one
// scale: vector g * kGroup + e (values 8 times that, 8 of them) is load8(group(head, g), e,
// scale(group(head, g))), so the kernels fetch a q8_0 block's scale once for its four vectors.
struct F16Rows {
  static constexpr int kGroup = 1;
  static const uint8_t* group(const uint8_t* head, int64_t g) {
    return head + 8 * g * int64_t{sizeof(uint16_t)};
  }
  static __m256 scale(const uint8_t*) { return _mm256_setzero_ps(); }  // unused
  static __m256 load8(const uint8_t* group, int, __m256) {
    return load_f16x8(reinterpret_cast<const uint16_t*>(group));
  }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n / 8; ++i)
      _mm256_store_ps(dst + 8 * i, load8(group(src, i), 0, _mm256_setzero_ps()));
  }
};

// Blocks of 32 values (head_dim and first are multiples of 32): d * qs[i], the same f32 product
// as dequantize_row_q8_0 (exact: an 11-bit d times a 7-bit integer), formed in registers.
struct Q8Rows {
  static constexpr int kGroup = kQK / 8;
  static const uint8_t* group(const uint8_t* head, int64_t g) {
    return head + g * int64_t{sizeof(BlockQ8_0)};
  }
  static __m256 scale(const uint8_t* group) {
    return _mm256_set1_ps(_cvtsh_ss(reinterpret_cast<const BlockQ8_0*>(group)->d));
  }
  static __m256 load8(const uint8_t* group, int e, __m256 d) {
    const int8_t* qs = reinterpret_cast<const BlockQ8_0*>(group)->qs + 8 * e;
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d);
  }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    for (int64_t b = 0; b < n / kQK; ++b) {
      const uint8_t* block = group(src, b);
      const __m256 d = scale(block);
      for (int e = 0; e < kGroup; ++e) _mm256_store_ps(dst + 8 * (b * kGroup + e), load8(block, e, d));
    }
  }
};

// attention_block's primitives; head_dim is a multiple of 8.
struct Avx2Isa {
  static constexpr bool kQueryPairs = false;
  static float scores(const float* q, const float* keys, int64_t n_keys, int64_t hd, float* score) {
    __m128 max4 = _mm_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {  // four keys at a time: independent FMA chains
      const float* k = keys + j * hd;
      __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
      for (int64_t d = 0; d < hd; d += 8) {
        const __m256 qv = _mm256_load_ps(q + d);
        d0 = _mm256_fmadd_ps(qv, _mm256_load_ps(k + d), d0);
        d1 = _mm256_fmadd_ps(qv, _mm256_load_ps(k + hd + d), d1);
        d2 = _mm256_fmadd_ps(qv, _mm256_load_ps(k + 2 * hd + d), d2);
        d3 = _mm256_fmadd_ps(qv, _mm256_load_ps(k + 3 * hd + d), d3);
      }
      const __m128 s4 = hsum4_avx2(d0, d1, d2, d3);
      _mm_storeu_ps(score + j, s4);
      max4 = _mm_max_ps(max4, s4);
    }
    max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    float max = _mm_cvtss_f32(_mm_max_ss(max4, _mm_movehdup_ps(max4)));
    for (; j < n_keys; ++j) {
      __m256 dot = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8)
        dot = _mm256_fmadd_ps(_mm256_load_ps(q + d), _mm256_load_ps(keys + j * hd + d), dot);
      score[j] = hsum_avx2(dot);
      max = score[j] > max ? score[j] : max;
    }
    return max;
  }
  static float exp_and_sum(float* score, int64_t n, float max) {
    const int64_t n_padded = (n + 7) / 8 * 8;
    for (int64_t j = n; j < n_padded; ++j) score[j] = -INFINITY;  // exp gives 0
    const __m256 m = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < n_padded; j += 8) {
      const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(score + j), m));
      _mm256_storeu_ps(score + j, p);
      sum = _mm256_add_ps(sum, p);
    }
    return hsum_avx2(sum);
  }
  static void accumulate(const float* p, const float* values, int64_t n, int64_t hd, float* acc) {
    int64_t d = 0;
    for (; d + 32 <= hd; d += 32) {  // 4 columns of vectors, 4 independent chains over keys
      __m256 a0 = _mm256_load_ps(acc + d), a1 = _mm256_load_ps(acc + d + 8);
      __m256 a2 = _mm256_load_ps(acc + d + 16), a3 = _mm256_load_ps(acc + d + 24);
      for (int64_t j = 0; j < n; ++j) {
        const __m256 pj = _mm256_broadcast_ss(p + j);
        const float* v = values + j * hd + d;
        a0 = _mm256_fmadd_ps(pj, _mm256_load_ps(v), a0);
        a1 = _mm256_fmadd_ps(pj, _mm256_load_ps(v + 8), a1);
        a2 = _mm256_fmadd_ps(pj, _mm256_load_ps(v + 16), a2);
        a3 = _mm256_fmadd_ps(pj, _mm256_load_ps(v + 24), a3);
      }
      _mm256_store_ps(acc + d, a0);
      _mm256_store_ps(acc + d + 8, a1);
      _mm256_store_ps(acc + d + 16, a2);
      _mm256_store_ps(acc + d + 24, a3);
    }
    for (; d < hd; d += 8) {
      __m256 a = _mm256_load_ps(acc + d);
      for (int64_t j = 0; j < n; ++j)
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_load_ps(values + j * hd + d), a);
      _mm256_store_ps(acc + d, a);
    }
  }
};

}  // namespace
}  // namespace ember::cpu
