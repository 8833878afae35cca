// cpu/elementwise.cpp: element-wise ops on f32 activations (residual add, bias, SwiGLU's silu·mul).
#include <cmath>

#include "cpu/ops.h"
#include "cpu/parallel.h"

namespace ember::cpu {

namespace {
constexpr int64_t kMinPerThread = 16384;  // below this, waking a worker costs more than it saves
}

void add(const float* a, const float* b, int64_t n, float* y, ThreadPool& pool) {
  parallel_for(pool, n, kMinPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = a[i] + b[i];
  });
}

void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols, ThreadPool& pool) {
  parallel_for(pool, n_rows, kMinPerThread / n_cols + 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = x + r * n_cols;
      for (int64_t i = 0; i < n_cols; ++i) xr[i] += bias[i];
    }
  });
}

void silu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool) {
  // expf dominates; worth threading sooner than a plain add.
  parallel_for(pool, n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      y[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

}  // namespace ember::cpu
