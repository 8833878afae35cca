// cpu/quantize_act.cpp: scalar activation quantization, the reference the SIMD twins match.
#include "cpu/quantize_act.h"

#include <cmath>

namespace ember::cpu {

void quantize_act_row_ref(const float* x, BlockQ8A* dst, int64_t n, int blocks_per_scale) {
  const int64_t run = 32 * int64_t{blocks_per_scale};
  for (int64_t r = 0; r < n / run; ++r, x += run) {
    float amax = 0.0f;
    for (int64_t i = 0; i < run; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int b = 0; b < blocks_per_scale; ++b) {
      BlockQ8A& out = dst[r * blocks_per_scale + b];
      int sum_lo = 0, sum = 0;
      for (int i = 0; i < 32; ++i) {
        // nearbyint rounds to nearest even in the default mode, as the SIMD cvtps does.
        const int q = static_cast<int>(std::nearbyint(x[32 * b + i] * id));
        out.qs[i] = static_cast<int8_t>(q);
        sum += q;
        if (i < 16) sum_lo += q;
      }
      out.d = d;
      out.s = d * static_cast<float>(sum);
      out.s_lo = d * static_cast<float>(sum_lo);
    }
  }
}

}  // namespace ember::cpu
