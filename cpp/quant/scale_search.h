// quant/scale_search.h: the scale searches behind the k-quant quantizers (llama.cpp's
// make_qx_quants, make_q3_quants, make_qkx2_quants without importance weights): given a group of
// values, find integer levels L and a scale (and min) that minimise a weighted error.
// Used by quant/quantize_k.cpp only; kept apart because it is numerics, not block layout.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ember {

inline constexpr float kGroupMaxEps = 1e-15f;  // a group whose |x| stays below this is all zero

// Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves the integer in the
// low mantissa bits (llama.cpp's nearest_int; cheaper than lrintf, independent of the rounding
// mode). Larger |v| give garbage, never undefined behaviour.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// The x[i] of largest magnitude (the first of equals, 0 if all are 0), its magnitude in *amax.
inline float largest_magnitude(int n, const float* x, float* amax) {
  float max = 0;
  *amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > *amax) {
      *amax = ax;
      max = x[i];
    }
  }
  return max;
}

// Symmetric fit x[i] ~ scale * (L[i] - nmax), L[i] in [0, 2 nmax), weights x^2; tries 18 scales
// around nmax / max|x| and keeps the one with the least weighted squared error. Returns scale.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L);

// Symmetric fit as above, refined by coordinate descent: each L[i] moves to its best value given
// the others while that lowers the error (up to 5 sweeps). Returns scale; L[i] in [0, 2 nmax).
float fit_symmetric_descent(int n, int nmax, const float* x, int8_t* L);

// Asymmetric fit x[i] ~ scale * L[i] - min, L[i] in [0, nmax], min >= 0 stored as *the_min:
// starts from the range, then tries nstep + 1 scales (rmin + rdelta * is + nmax) / range, each
// with the least-squares scale and min for its L, and keeps the one with the least weighted
// error (absolute if use_mad, else squared). aux[n] is scratch. Returns scale.
float fit_with_min(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                   uint8_t* aux, float rmin, float rdelta, int nstep, bool use_mad);

}  // namespace ember
