// cpu/softmax.cpp: numerically stable softmax over rows, in place.
#include <cmath>

#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

void softmax(float* x, int64_t n_rows, int64_t n_cols, ThreadPool& pool) {
  parallel_for(pool, n_rows, 4096 / n_cols + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = x + r * n_cols;
      float max = -INFINITY;
      for (int64_t i = 0; i < n_cols; ++i) max = xr[i] > max ? xr[i] : max;
      double sum = 0.0;
      for (int64_t i = 0; i < n_cols; ++i) {
        xr[i] = std::exp(xr[i] - max);
        sum += xr[i];
      }
      const float inv_sum = static_cast<float>(1.0 / sum);
      for (int64_t i = 0; i < n_cols; ++i) xr[i] *= inv_sum;
    }
  });
}

}  // namespace ember::cpu
