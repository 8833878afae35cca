// cuda/softmax.cu: softmax over rows in place (one block per row).
#include "cuda/backend_cuda.h"
#include "cuda/device.h"
#include "cuda/reduce.cuh"

namespace ember {

namespace {

// x[r, :] = exp(x[r, :] - max) / Σ exp(x[r, :] - max).
__global__ void softmax_kernel(float* x, int64_t n_cols) {
  __shared__ float scratch[cuda::kRowThreads / 32];
  float* xr = x + int64_t{blockIdx.x} * n_cols;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) m = fmaxf(m, xr[i]);
  m = cuda::block_reduce<true>(m, scratch);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) {
    const float e = expf(xr[i] - m);
    xr[i] = e;
    s += e;
  }
  const float inv = 1.0f / cuda::block_reduce<false>(s, scratch);
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) xr[i] *= inv;
}

}  // namespace

void CudaBackend::softmax(float* x, int64_t n_rows, int64_t n_cols) {
  if (n_rows == 0) return;
  use();
  softmax_kernel<<<static_cast<unsigned>(n_rows), cuda::kRowThreads, 0, stream_>>>(x, n_cols);
  launched("softmax");
}

}  // namespace ember
