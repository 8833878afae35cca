// cpu/attention_avx512.cpp: AVX-512 variants of attention_block's primitives (16 lanes: half the
// conversions, loads and FMAs of the AVX2 ones), over f16 or q8_0 cache rows, for head_dim a
// multiple of 16. Compiled with AVX-512 flags and called only behind OpsIsa::avx512. The scores'
// exponentials are math_avx2.h's (a tile is at most 32 of them; the dot products are the work).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/attention_block.h"
#include "cpu/math_avx2.h"
#include "cpu/op_kernels.h"
#include "quant/blocks.h"

// GCC 12 reports the unmasked conversions' internal _mm512_undefined_* operands as maybe
// uninitialized (a false positive of its intrinsics headers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ember::cpu {

namespace {

// The KV row formats as attention_block.h asks for them (twins in attention.cpp and
// attention_avx2.cpp), 16 values per instruction.
struct F16Rows {
  static int64_t bytes(int64_t n) { return n * int64_t{sizeof(uint16_t)}; }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; i += 16)
      _mm512_store_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  }
};

// Blocks of 32 values: d * qs[i], the same f32 product as dequantize_row_q8_0 (exact: an
// 11-bit d times a 7-bit integer).
struct Q8Rows {
  static int64_t bytes(int64_t n) { return n / kQK * int64_t{sizeof(BlockQ8_0)}; }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
    for (int64_t b = 0; b < n / kQK; ++b) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(blocks[b].d));
      for (int h = 0; h < 2; ++h) {
        const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs + 16 * h));
        _mm512_store_ps(dst + b * kQK + 16 * h,
                        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8)), d));
      }
    }
  }
};

// The 16 lanes of v folded to 8 (lane i + lane i + 8), for the AVX2 horizontal sums.
inline __m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

// q · key for each of K consecutive keys (K independent FMA chains), as folded vectors.
template <int K>
inline void dots(const float* q, const float* keys, int64_t hd, __m256* out) {
  __m512 acc[K];
  for (int k = 0; k < K; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; d += 16) {
    const __m512 qv = _mm512_load_ps(q + d);
    for (int k = 0; k < K; ++k) acc[k] = _mm512_fmadd_ps(qv, _mm512_load_ps(keys + k * hd + d), acc[k]);
  }
  for (int k = 0; k < K; ++k) out[k] = fold(acc[k]);
}

// attention_block's primitives; head_dim is a multiple of 16.
struct Avx512Isa {
  static float scores(const float* q, const float* keys, int64_t n_keys, int64_t hd, float* score) {
    __m128 max4 = _mm_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n_keys; j += 8) {  // eight keys at a time: eight FMA chains in flight
      __m256 f[8];
      dots<8>(q, keys + j * hd, hd, f);
      const __m128 lo = hsum4_avx2(f[0], f[1], f[2], f[3]), hi = hsum4_avx2(f[4], f[5], f[6], f[7]);
      _mm_storeu_ps(score + j, lo);
      _mm_storeu_ps(score + j + 4, hi);
      max4 = _mm_max_ps(max4, _mm_max_ps(lo, hi));
    }
    for (; j + 4 <= n_keys; j += 4) {
      __m256 f[4];
      dots<4>(q, keys + j * hd, hd, f);
      const __m128 s4 = hsum4_avx2(f[0], f[1], f[2], f[3]);
      _mm_storeu_ps(score + j, s4);
      max4 = _mm_max_ps(max4, s4);
    }
    max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    float max = _mm_cvtss_f32(_mm_max_ss(max4, _mm_movehdup_ps(max4)));
    for (; j < n_keys; ++j) {
      __m256 f[1];
      dots<1>(q, keys + j * hd, hd, f);
      score[j] = hsum_avx2(f[0]);
      max = score[j] > max ? score[j] : max;
    }
    return max;
  }
  static float exp_and_sum(float* score, int64_t n, float max) { return exp_and_sum_avx2(score, n, max); }
  static void accumulate(const float* p, const float* values, int64_t n, int64_t hd, float* acc) {
    int64_t d = 0;
    for (; d + 64 <= hd; d += 64) {  // 4 vectors of columns, even and odd keys apart: 8 chains
      __m512 even[4], odd[4];
      for (int c = 0; c < 4; ++c) {
        even[c] = _mm512_load_ps(acc + d + 16 * c);
        odd[c] = _mm512_setzero_ps();
      }
      int64_t j = 0;
      for (; j + 2 <= n; j += 2) {
        const __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
        const float* v = values + j * hd + d;
        for (int c = 0; c < 4; ++c) {
          even[c] = _mm512_fmadd_ps(p0, _mm512_load_ps(v + 16 * c), even[c]);
          odd[c] = _mm512_fmadd_ps(p1, _mm512_load_ps(v + hd + 16 * c), odd[c]);
        }
      }
      if (j < n) {
        const __m512 p0 = _mm512_set1_ps(p[j]);
        for (int c = 0; c < 4; ++c)
          even[c] = _mm512_fmadd_ps(p0, _mm512_load_ps(values + j * hd + d + 16 * c), even[c]);
      }
      for (int c = 0; c < 4; ++c) _mm512_store_ps(acc + d + 16 * c, _mm512_add_ps(even[c], odd[c]));
    }
    for (; d < hd; d += 16) {
      __m512 a = _mm512_load_ps(acc + d);
      for (int64_t j = 0; j < n; ++j)
        a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_load_ps(values + j * hd + d), a);
      _mm512_store_ps(acc + d, a);
    }
  }
};

}  // namespace

void attention_block_avx512(const AttentionBlock& block, const KVView& kv) {
  if (kv.type == DType::q8_0) return attention_block<Avx512Isa, Q8Rows>(block, kv);
  attention_block<Avx512Isa, F16Rows>(block, kv);
}

}  // namespace ember::cpu
