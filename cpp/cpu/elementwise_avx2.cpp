// cpu/elementwise_avx2.cpp: AVX2/FMA variants of element-wise ops whose scalar form is slow
// (silu needs an exp per element). Called only behind OpsIsa::avx2_f16c.
#include <cmath>

#include "cpu/math_avx2.h"
#include "cpu/op_kernels.h"

namespace ember::cpu {

void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace ember::cpu
