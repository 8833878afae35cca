// cpu/rope.cpp: rotary position embedding, in place, in either pairing layout.
#include <cmath>

#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

void rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const RopeParams& params, ThreadPool& pool) {
  const int64_t n_pairs = params.n_rot / 2;
  // Pair i of a head is (i * stride, i * stride + partner): (2i, 2i+1) or (i, i + n_rot/2).
  // Dims from n_rot to head_dim pass through unrotated.
  const bool neox = params.layout == RopeLayout::neox;
  const int64_t stride = neox ? 1 : 2;
  const int64_t partner = neox ? n_pairs : 1;
  const int64_t min_rows = 4096 / (n_heads * head_dim) + 1;
  parallel_for(pool, n_rows, min_rows, [&](int64_t begin, int64_t end) {
    constexpr int64_t kMaxPairs = kMaxHeadDim / 2;
    float cos_theta[kMaxPairs], sin_theta[kMaxPairs];  // [n_pairs] for the current row
    for (int64_t r = begin; r < end; ++r) {
      const float pos = static_cast<float>(positions[r]);
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float theta = pos * params.inv_freq[i];  // f32, as transformers computes it
        cos_theta[i] = std::cos(theta) * params.mscale;
        sin_theta[i] = std::sin(theta) * params.mscale;
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* head = x + (r * n_heads + h) * head_dim;
        for (int64_t i = 0; i < n_pairs; ++i) {
          float* a = head + i * stride;
          float* b = a + partner;
          const float a0 = *a, b0 = *b;
          *a = a0 * cos_theta[i] - b0 * sin_theta[i];
          *b = a0 * sin_theta[i] + b0 * cos_theta[i];
        }
      }
    }
  });
}

}  // namespace ember::cpu
