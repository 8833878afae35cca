// cpu/x86/attention_avx512.cpp: attention_block with two queries per instruction. Where two queries
// of a block see the same keys of a tile (the heads of one row, and rows both past the tile),
// each 16-lane FMA does the 8-lane step of the AVX2 kernel (attention_avx2.h) for both: query 0
// in lanes 0-7, query 1 in lanes 8-15, against the key's or value's 8 values broadcast to both
// halves. Every lane sees the AVX2 kernel's operations in its order, and the horizontal sums are
// the AVX2 hadd tree per half, so each query gets the AVX2 kernel's bits: the ISA levels agree and
// no model's output moves (greedy near-ties in small models flip on any change of rounding).
// Half the FMAs and key / value loads of the AVX2 kernel; the exponentials likewise run 16 lanes
// (exp16, exp_avx2's operations on exp_avx2's constants). Where four queries see the same keys
// (GQA groups of 3 with 2+ rows, groups of 4, prefill rows past the tile) two pairs go through
// the tile together and share each key and value load (same FMAs, so the same bits). One thread,
// SmolLM2 shapes, best of 5 alternating runs: attention alone (30 layers, 800 keys) 12 rows 13.7 ->
// 12.0 ms, 4 rows 5.65 -> 4.84; a 12-row verification step at 700 tokens 27.9 -> 27.0 ms, 4 rows
// 12.1 -> 11.3; pp512 835 -> 862 t/s, pp2048 437 -> 491.
// Compiled with AVX-512 flags and reached only through the avx512 op table (op_kernels.h).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu/attention_block.h"
#include "cpu/op_kernels.h"
#include "cpu/x86/attention_avx2.h"

namespace ember::cpu {

namespace {

// (Masked forms of the broadcasts and conversions: GCC 12 warns, falsely, about the plain
// intrinsics' undefined pass-through operands.)
inline __m512 dup8(const float* p) { return _mm512_maskz_broadcast_f32x8(0xffff, _mm256_load_ps(p)); }

inline __m512 join8(__m256 low, __m256 high) {
  return _mm512_maskz_insertf32x8(0xffff, _mm512_castps256_ps512(low), high, 1);
}
inline __m256 low8(__m512 v) { return _mm512_maskz_extractf32x8_ps(0xff, v, 0); }
inline __m256 high8(__m512 v) { return _mm512_maskz_extractf32x8_ps(0xff, v, 1); }

// _mm256_hadd_ps of each 256-bit half: per 128-bit lane {a0 + a1, a2 + a3, b0 + b1, b2 + b3}.
inline __m512 hadd_halves(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

// exp_avx2 (math_avx2.h) on 16 lanes: the same operations lane by lane, so the same values.
inline __m512 exp16(__m512 x) {
  using C = ExpConstants;
  const __m512 log2e = _mm512_set1_ps(C::kLog2e);
  const __m512 ln2_hi = _mm512_set1_ps(C::kLn2Hi);
  const __m512 ln2_lo = _mm512_set1_ps(C::kLn2Lo);
  x = _mm512_maskz_min_ps(0xffff, x, _mm512_set1_ps(C::kMax));
  x = _mm512_maskz_max_ps(0xffff, x, _mm512_set1_ps(C::kMin));
  const __m512 k = _mm512_maskz_roundscale_ps(0xffff, _mm512_mul_ps(x, log2e),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, ln2_hi, x);
  r = _mm512_fnmadd_ps(k, ln2_lo, r);
  __m512 y = _mm512_set1_ps(C::kPoly[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(C::kPoly[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i pow2k = _mm512_maskz_slli_epi32(
      0xffff, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(0xffff, k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(pow2k));
}

// f16 rows converted 16 values at a time (the conversion is exact: the same values).
struct F16Rows16 : F16Rows {
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(
                                    0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
    }
    if (i < n) F16Rows::to_f32(src + 2 * i, dst + i, n - i);
  }
};

// For each of P query pairs (p[2k], p[2k + 1], acc[2k], acc[2k + 1]): acc0 / acc1[d0, d0 + 8 NC) +=
// Σ_j p0 / p1[j] * values[j][...]: Avx2Isa::accumulate's FMAs, j in order, both queries at once.
// The pairs share each value vector's load.
template <int NC, int P>
inline void accumulate_chunks(const float* const* p, const float* values, int64_t n, int64_t hd, int64_t d0,
                              float* const* acc) {
  __m512 a[P][NC];
#pragma GCC unroll 2
  for (int k = 0; k < P; ++k) {
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      a[k][c] = join8(_mm256_load_ps(acc[2 * k] + d0 + 8 * c), _mm256_load_ps(acc[2 * k + 1] + d0 + 8 * c));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 pj[P];
#pragma GCC unroll 2
    for (int k = 0; k < P; ++k) pj[k] = join8(_mm256_set1_ps(p[2 * k][j]), _mm256_set1_ps(p[2 * k + 1][j]));
    const float* v = values + j * hd + d0;
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      const __m512 vc = dup8(v + 8 * c);
#pragma GCC unroll 2
      for (int k = 0; k < P; ++k) a[k][c] = _mm512_fmadd_ps(pj[k], vc, a[k][c]);
    }
  }
#pragma GCC unroll 2
  for (int k = 0; k < P; ++k) {
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      _mm256_store_ps(acc[2 * k] + d0 + 8 * c, low8(a[k][c]));
      _mm256_store_ps(acc[2 * k + 1] + d0 + 8 * c, high8(a[k][c]));
    }
  }
}

struct Avx512Isa : Avx2Isa {
  static constexpr bool kQueryPairs = true;

  // Avx2Isa::scores for P pairs of queries (q[2k], q[2k + 1] -> score[2k], score[2k + 1], max[..]):
  // per key its 8 partial sums over d in order, the hadd tree of four keys at a time (the leftover
  // keys one at a time), and the same max steps. NC = hd / 8 where it is a constant (the common
  // head sizes: the d loop unrolled); 0 for any other head size. Eight keys per step (eight
  // independent FMA chains a pair; each group of four gets the four-key tree, so the bits are the
  // same), and the pairs share each key vector's load. Against four keys per step with the d loop
  // rolled: SmolLM2-shaped attention, 8 rows at 700 keys, 1 thread, min of six interleaved runs
  // 7.16 -> 6.83 ms.
  template <int NC, int P>
  static void scores_nc(const float* const* q, const float* keys, int64_t n_keys, int64_t hd,
                        float* const* score, float* max) {
    const int64_t nc = NC > 0 ? NC : hd / 8;
    alignas(64) float q01[P][2 * kMaxHeadDim];  // per pair: 8 values of q0, then the same 8 of q1, ...
    for (int k = 0; k < P; ++k) {
      for (int64_t c = 0; c < nc; ++c) {
        _mm512_store_ps(q01[k] + 16 * c,
                        join8(_mm256_load_ps(q[2 * k] + 8 * c), _mm256_load_ps(q[2 * k + 1] + 8 * c)));
      }
    }
    __m128 m[2 * P];
    for (int i = 0; i < 2 * P; ++i) m[i] = _mm_set1_ps(-INFINITY);
    // Pair k's scores of keys j .. j + 3 from their partial sums d[0..3] (hsum4_avx2 per half).
    auto four = [&](int k, int64_t j, const __m512* d) {
      const __m512 abcd = hadd_halves(hadd_halves(d[0], d[1]), hadd_halves(d[2], d[3]));
      const __m512 sums = _mm512_add_ps(
          abcd, _mm512_maskz_shuffle_f32x4(0xffff, abcd, abcd, _MM_SHUFFLE(2, 3, 0, 1)));
      const __m128 s0 = _mm512_maskz_extractf32x4_ps(0xf, sums, 0),
                   s1 = _mm512_maskz_extractf32x4_ps(0xf, sums, 2);
      _mm_storeu_ps(score[2 * k] + j, s0);
      _mm_storeu_ps(score[2 * k + 1] + j, s1);
      m[2 * k] = _mm_max_ps(m[2 * k], s0);
      m[2 * k + 1] = _mm_max_ps(m[2 * k + 1], s1);
    };
    // Keys j .. j + K: K independent FMA chains per pair over d, then the tree of each group of four.
    auto key_step = [&]<int K>(int64_t j) {
      const float* kp = keys + j * hd;
      __m512 d[P][K];
#pragma GCC unroll 2
      for (int k = 0; k < P; ++k) {
#pragma GCC unroll 8
        for (int i = 0; i < K; ++i) d[k][i] = _mm512_setzero_ps();
      }
#pragma GCC unroll 16
      for (int64_t c = 0; c < nc; ++c) {
        __m512 qv[P];
#pragma GCC unroll 2
        for (int k = 0; k < P; ++k) qv[k] = _mm512_load_ps(q01[k] + 16 * c);
#pragma GCC unroll 8
        for (int i = 0; i < K; ++i) {
          const __m512 kv = dup8(kp + i * hd + 8 * c);
#pragma GCC unroll 2
          for (int k = 0; k < P; ++k) d[k][i] = _mm512_fmadd_ps(qv[k], kv, d[k][i]);
        }
      }
#pragma GCC unroll 2
      for (int k = 0; k < P; ++k) {
        for (int i = 0; i < K; i += 4) four(k, j + i, d[k] + i);
      }
    };
    int64_t j = 0;
    for (; j + 8 <= n_keys; j += 8) key_step.template operator()<8>(j);
    for (; j + 4 <= n_keys; j += 4) key_step.template operator()<4>(j);
    float x[2 * P];
    for (int i = 0; i < 2 * P; ++i) {
      m[i] = _mm_max_ps(m[i], _mm_movehl_ps(m[i], m[i]));
      x[i] = _mm_cvtss_f32(_mm_max_ss(m[i], _mm_movehdup_ps(m[i])));
    }
    for (; j < n_keys; ++j) {
      for (int k = 0; k < P; ++k) {
        __m512 dot = _mm512_setzero_ps();
        for (int64_t c = 0; c < nc; ++c)
          dot = _mm512_fmadd_ps(_mm512_load_ps(q01[k] + 16 * c), dup8(keys + j * hd + 8 * c), dot);
        float* s0 = score[2 * k];
        float* s1 = score[2 * k + 1];
        s0[j] = hsum_avx2(low8(dot));
        s1[j] = hsum_avx2(high8(dot));
        x[2 * k] = s0[j] > x[2 * k] ? s0[j] : x[2 * k];
        x[2 * k + 1] = s1[j] > x[2 * k + 1] ? s1[j] : x[2 * k + 1];
      }
    }
    for (int i = 0; i < 2 * P; ++i) max[i] = x[i];
  }

  template <int P>
  static void scores_pairs(const float* const* q, const float* keys, int64_t n_keys, int64_t hd,
                           float* const* score, float* max) {
    switch (hd) {
      case 64: return scores_nc<8, P>(q, keys, n_keys, hd, score, max);
      case 128: return scores_nc<16, P>(q, keys, n_keys, hd, score, max);
      default: return scores_nc<0, P>(q, keys, n_keys, hd, score, max);
    }
  }

  // Avx2Isa::exp_and_sum for two queries' scores (each with its own max): 8 of each per exp.
  static void exp_and_sum2(float* score0, float* score1, int64_t n, float max0, float max1, float* sum0,
                           float* sum1) {
    const int64_t n_padded = (n + 7) / 8 * 8;
    for (int64_t j = n; j < n_padded; ++j) score0[j] = score1[j] = -INFINITY;  // exp gives 0
    const __m512 m = join8(_mm256_set1_ps(max0), _mm256_set1_ps(max1));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n_padded; j += 8) {
      const __m512 p = exp16(
          _mm512_sub_ps(join8(_mm256_loadu_ps(score0 + j), _mm256_loadu_ps(score1 + j)), m));
      _mm256_storeu_ps(score0 + j, low8(p));
      _mm256_storeu_ps(score1 + j, high8(p));
      sum = _mm512_add_ps(sum, p);
    }
    *sum0 = hsum_avx2(low8(sum));
    *sum1 = hsum_avx2(high8(sum));
  }

  template <int P>
  static void accumulate_pairs(const float* const* p, const float* values, int64_t n, int64_t hd,
                               float* const* acc) {
    int64_t d = 0;
    for (; d + 64 <= hd; d += 64) accumulate_chunks<8, P>(p, values, n, hd, d, acc);
    if (d + 32 <= hd) {
      accumulate_chunks<4, P>(p, values, n, hd, d, acc);
      d += 32;
    }
    for (; d < hd; d += 8) accumulate_chunks<1, P>(p, values, n, hd, d, acc);
  }
};

}  // namespace

void attention_block_avx512(const AttentionBlock& block, const KVView& kv) {
  if (kv.type == DType::q8_0) return attention_block<Avx512Isa, Q8Rows>(block, kv);
  attention_block<Avx512Isa, F16Rows16>(block, kv);
}

}  // namespace ember::cpu
