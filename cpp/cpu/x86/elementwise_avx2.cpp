// cpu/x86/elementwise_avx2.cpp: AVX2/FMA variants of element-wise ops whose scalar form is slow
// (silu needs an exp per element). Called only behind the avx2 and avx512 op tables (op_kernels.h).
#include <cmath>
#include <cstring>

#include "cpu/op_kernels.h"
#include "cpu/x86/math_avx2.h"

namespace ember::cpu {

// The last n % 8 elements go through the same vector code (padded), so an element's result does
// not depend on where it falls: a row gives the same bits alone or in a batch, whatever the split.
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto silu_mul8 = [&](const float* g8, const float* u8, float* y8) {
    const __m256 g = _mm256_loadu_ps(g8);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(y8, _mm256_mul_ps(silu, _mm256_loadu_ps(u8)));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) silu_mul8(gate + i, up + i, y + i);
  if (i < n) {
    float g[8] = {}, u[8] = {}, out[8];
    std::memcpy(g, gate + i, sizeof(float) * (n - i));
    std::memcpy(u, up + i, sizeof(float) * (n - i));
    silu_mul8(g, u, out);
    std::memcpy(y + i, out, sizeof(float) * (n - i));
  }
}

}  // namespace ember::cpu
