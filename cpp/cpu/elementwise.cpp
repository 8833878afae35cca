// cpu/elementwise.cpp: element-wise ops on f32 activations (residual add, bias, scale, SwiGLU's
// silu·mul, GeGLU's gelu·mul).
#include <cmath>

#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "cpu/parallel.h"
#include "quant/blocks.h"

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

void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* y, const OpsIsa& isa,
              ThreadPool& pool) {
  const auto kernel = isa.avx2_f16c ? silu_mul_avx2 : silu_mul_scalar;
  // The exp makes this worth threading sooner than a plain add.
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    kernel(gate + begin, up + begin, end - begin, y + begin);
  });
}

void gelu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // As llama.cpp computes it (a table over f16 inputs): gelu of the f16-rounded input,
      // rounded to f16, identity past |x| >= 10. Gemma's greedy text has near ties (margins of
      // 0.02 in the logits), and matching the peer's rounding keeps both engines' text equal.
      const float x = gate[i];
      float g = x >= 10.0f ? x : 0.0f;
      if (x > -10.0f && x < 10.0f) {
        const float h = f16_to_f32(f32_to_f16(x));
        g = f16_to_f32(f32_to_f16(0.5f * h * (1.0f + std::tanh(kSqrt2OverPi * h * (1.0f + 0.044715f * h * h)))));
      }
      y[i] = g * up[i];
    }
  });
}

void scale(float* x, int64_t n, float s, ThreadPool& pool) {
  parallel_for(pool, n, kMinPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= s;
  });
}

}  // namespace ember::cpu
