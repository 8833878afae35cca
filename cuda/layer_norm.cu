// cuda/layer_norm.cu: LayerNorm over rows (one block per row): the mean, then the population
// variance of the centred values (two passes, as the CPU computes it).
#include "cuda/backend_cuda.h"
#include "cuda/device.h"
#include "cuda/reduce.cuh"

namespace ember {

namespace {

// y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias; y may alias x.
__global__ void layer_norm_kernel(const float* x, const float* __restrict__ weight,
                                  const float* __restrict__ bias, float* y, int64_t n_cols, float eps) {
  __shared__ float scratch[cuda::kRowThreads / 32];
  const float* xr = x + int64_t{blockIdx.x} * n_cols;
  float* yr = y + int64_t{blockIdx.x} * n_cols;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) s += xr[i];
  const float mean = cuda::block_reduce<false>(s, scratch) / static_cast<float>(n_cols);
  float q = 0.0f;
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) {
    const float c = xr[i] - mean;
    q = fmaf(c, c, q);
  }
  const float var = cuda::block_reduce<false>(q, scratch) / static_cast<float>(n_cols);
  const float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) {
    yr[i] = __fadd_rn(__fmul_rn(__fmul_rn(xr[i] - mean, inv), weight[i]), bias[i]);
  }
}

}  // namespace

void CudaBackend::layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows,
                             int64_t n_cols, float eps, float* y) {
  if (n_rows == 0) return;
  use();
  layer_norm_kernel<<<static_cast<unsigned>(n_rows), cuda::kRowThreads, 0, stream_>>>(x, weight, bias, y,
                                                                                      n_cols, eps);
  launched("layer_norm");
}

}  // namespace ember
