// cpu/elementwise.cpp: element-wise ops on f32 activations (residual add, bias, scale, SwiGLU's
// silu·mul, gpt-oss's clamped SwiGLU, GeGLU's gelu·mul, BERT's gelu, Gemma 2's logit soft-capping, the
// experts' scaled scatter-add).
#include <algorithm>
#include <cmath>

#include "cpu/op_kernels.h"
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

void add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids, int64_t n_cols,
                     float* y, ThreadPool& pool) {
  // Split by columns: rows of y named twice are then never written by two threads, and each
  // column accumulates in order of i.
  parallel_for(pool, n_cols, kMinPerThread / (n_ids + 1) + 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = 0; i < n_ids; ++i) {
      const float* xi = x + i * n_cols;
      float* yr = y + int64_t{ids[i]} * n_cols;
      for (int64_t c = begin; c < end; ++c) yr[c] += scales[i] * xi[c];
    }
  });
}

void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* y, const OpKernels& kernels,
              ThreadPool& pool) {
  const auto kernel = kernels.silu_mul;  // any n (the SIMD kernels pad the tail)
  // The exp makes this worth threading sooner than a plain add.
  parallel_for(pool, n, 4096,
               [&](int64_t begin, int64_t end) { kernel(gate + begin, up + begin, end - begin, y + begin); });
}

void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y,
                ThreadPool& pool) {
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
      y[i] = g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f);
    }
  });
}

void gelu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float x = gate[i];
      y[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))) * up[i];
    }
  });
}

void gelu(const float* x, int64_t n, float* y, ThreadPool& pool) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  });
}

void scale(float* x, int64_t n, float s, ThreadPool& pool) {
  parallel_for(pool, n, kMinPerThread, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= s;
  });
}

void softcap(float* x, int64_t n, float cap, ThreadPool& pool) {
  const float inv_cap = 1.0f / cap;
  parallel_for(pool, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = cap * std::tanh(x[i] * inv_cap);
  });
}

}  // namespace ember::cpu
