// cuda/elementwise.cu: add, add_bias, silu_mul, gelu_mul, gelu, scale and softcap, one kernel (an
// op code); and add_rows_scaled, the mixture-of-experts scatter.
#include "cuda/backend_cuda.h"
#include "cuda/device.h"

namespace ember {

namespace {

// y[i] = op(a[i], b[i] or b[i % n_cols], s) for i < n; y may alias a or b.
__global__ void elementwise_kernel(int op, const float* a, const float* b, int64_t n, int64_t n_cols, float s,
                                   float* y) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = a[i];
  float r;
  switch (op) {
    case cuda::kAdd: r = x + b[i]; break;
    case cuda::kAddBias: r = x + b[i % n_cols]; break;
    case cuda::kSiluMul: r = x / (1.0f + expf(-x)) * b[i]; break;
    case cuda::kGeluMul: {
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): the same value without tanh's cancellation.
      const float u = 0.7978845608028654f * x * (1.0f + 0.044715f * x * x);
      r = x / (1.0f + expf(-2.0f * u)) * b[i];
      break;
    }
    case cuda::kGelu: r = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); break;
    case cuda::kScale: r = x * s; break;
    default: r = s * tanhf(x * (1.0f / s)); break;  // kSoftcap
  }
  y[i] = r;
}

// y[ids[i], c] += scales[i] * x[i, c] for i in order: one thread per column c.
__global__ void add_rows_scaled_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids,
                                       const float* __restrict__ scales, int64_t n_ids, int64_t n_cols,
                                       float* y) {
  const int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= n_cols) return;
  for (int64_t i = 0; i < n_ids; ++i) {
    float* out = y + int64_t{ids[i]} * n_cols + c;
    *out = __fadd_rn(*out, __fmul_rn(scales[i], x[i * n_cols + c]));  // as the CPU: no FMA
  }
}

}  // namespace

cudaError_t cuda::probe_kernel_image() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, elementwise_kernel);
}

void CudaBackend::elementwise(int op, const float* a, const float* b, int64_t n, int64_t n_cols, float s,
                              float* y) {
  if (n == 0) return;
  use();
  elementwise_kernel<<<cuda::blocks_for(n, 256), 256, 0, stream_>>>(op, a, b, n, n_cols, s, y);
  launched("elementwise op");
}

void CudaBackend::add(const float* a, const float* b, int64_t n, float* y) {
  elementwise(cuda::kAdd, a, b, n, 1, 0, y);
}
void CudaBackend::add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols) {
  elementwise(cuda::kAddBias, x, bias, n_rows * n_cols, n_cols, 0, x);
}
void CudaBackend::silu_mul(const float* gate, const float* up, int64_t n, float* y) {
  elementwise(cuda::kSiluMul, gate, up, n, 1, 0, y);
}
void CudaBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* y) {
  elementwise(cuda::kGeluMul, gate, up, n, 1, 0, y);
}
void CudaBackend::gelu(const float* x, int64_t n, float* y) { elementwise(cuda::kGelu, x, x, n, 1, 0, y); }
void CudaBackend::scale(float* x, int64_t n, float s) { elementwise(cuda::kScale, x, x, n, 1, s, x); }
void CudaBackend::softcap(float* x, int64_t n, float cap) { elementwise(cuda::kSoftcap, x, x, n, 1, cap, x); }

void CudaBackend::add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids,
                                  int64_t n_cols, float* y) {
  if (n_ids == 0 || n_cols == 0) return;
  use();
  const int32_t* device_ids = argument(ids, n_ids);
  const float* device_scales = argument(scales, n_ids);
  add_rows_scaled_kernel<<<cuda::blocks_for(n_cols, 256), 256, 0, stream_>>>(x, device_ids, device_scales,
                                                                             n_ids, n_cols, y);
  launched("add_rows_scaled");
}

}  // namespace ember
