// cpu/x86/math_avx2.h: small AVX2/FMA vector math shared by the ops' *_avx2.cpp files. Include it
// only from files compiled with AVX2 flags: everything here has internal linkage, so no copy of
// it can be picked by the linker for code that runs on CPUs without AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ember::cpu {
namespace {

// exp_avx2's constants (Cephes' expf), shared with its 16-lane twin in attention_avx512.cpp,
// which must give the same values.
struct ExpConstants {
  static constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kMax = 88.3762626647949f, kMin = -87.3365478515625f;  // kMin keeps 2^k normal
  static constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

// e^x for each lane, within ~2 ulp (Cephes' expf polynomial); 0 below -87.3, clamped at +88.3.
inline __m256 exp_avx2(__m256 x) {
  using C = ExpConstants;
  const __m256 log2e = _mm256_set1_ps(C::kLog2e);
  const __m256 ln2_hi = _mm256_set1_ps(C::kLn2Hi);
  const __m256 ln2_lo = _mm256_set1_ps(C::kLn2Lo);
  x = _mm256_min_ps(x, _mm256_set1_ps(C::kMax));
  x = _mm256_max_ps(x, _mm256_set1_ps(C::kMin));
  // x = k ln2 + r, |r| <= ln2 / 2
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, ln2_hi, x);
  r = _mm256_fnmadd_ps(k, ln2_lo, r);
  __m256 y = _mm256_set1_ps(C::kPoly[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(C::kPoly[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // y * 2^k, building 2^k from its exponent bits (k >= -126 after the clamp)
  const __m256i pow2k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)),
                                          23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2k));
}

inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// {Σa, Σb, Σc, Σd} of four vectors at once.
inline __m128 hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per 128-bit half: partial Σa, Σb, Σc, Σd
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline float hmax_avx2(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace
}  // namespace ember::cpu
