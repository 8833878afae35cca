// cpu/rms_norm.cpp: RMSNorm over rows (also used per head, for qwen3's Q/K norms).
#include <cmath>

#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

namespace {

// Sum of squares with 8 independent partial sums, so the compiler can vectorize it.
float sum_of_squares(const float* x, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j] * x[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int j = 0; j < 8; ++j) sum += partial[j];
  return sum;
}

}  // namespace

void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps, float* y,
              ThreadPool& pool) {
  const int64_t min_rows = 8192 / n_cols + 1;  // about 8K elements per thread at least
  parallel_for(pool, n_rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n_cols;
      float* yr = y + r * n_cols;
      const float inv_rms = 1.0f / std::sqrt(sum_of_squares(xr, n_cols) / n_cols + eps);
      for (int64_t i = 0; i < n_cols; ++i) yr[i] = xr[i] * inv_rms * weight[i];
    }
  });
}

}  // namespace ember::cpu
