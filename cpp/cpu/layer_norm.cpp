// cpu/layer_norm.cpp: LayerNorm over rows (BERT's norms), mean and variance in two passes over
// each row, in f32 as transformers computes them.
#include <cmath>

#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

void layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows, int64_t n_cols,
                float eps, float* y, ThreadPool& pool) {
  const int64_t min_rows = 8192 / n_cols + 1;  // about 8K elements per thread at least
  parallel_for(pool, n_rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n_cols;
      float* yr = y + r * n_cols;
      float sum = 0.0f;
      for (int64_t i = 0; i < n_cols; ++i) sum += xr[i];
      const float mean = sum / static_cast<float>(n_cols);
      float sum_sq = 0.0f;
      for (int64_t i = 0; i < n_cols; ++i) sum_sq += (xr[i] - mean) * (xr[i] - mean);
      const float inv_std = 1.0f / std::sqrt(sum_sq / static_cast<float>(n_cols) + eps);
      for (int64_t i = 0; i < n_cols; ++i) yr[i] = (xr[i] - mean) * inv_std * weight[i] + bias[i];
    }
  });
}

}  // namespace ember::cpu
