// cuda/rms_norm.cu: RMSNorm over rows (one block per row).
#include "cuda/backend_cuda.h"
#include "cuda/device.h"
#include "cuda/reduce.cuh"

namespace ember {

namespace {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight; x, y [n_rows, n_cols] (y may alias x).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ weight, float* y, int64_t n_cols,
                                float eps) {
  __shared__ float scratch[cuda::kRowThreads / 32];
  const float* xr = x + int64_t{blockIdx.x} * n_cols;
  float* yr = y + int64_t{blockIdx.x} * n_cols;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads) s = fmaf(xr[i], xr[i], s);
  s = cuda::block_reduce<false>(s, scratch);
  const float inv_rms = 1.0f / sqrtf(s / static_cast<float>(n_cols) + eps);
  for (int64_t i = threadIdx.x; i < n_cols; i += cuda::kRowThreads)
    yr[i] = __fmul_rn(xr[i], inv_rms) * weight[i];
}

}  // namespace

void CudaBackend::rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps,
                           float* y) {
  if (n_rows == 0) return;
  use();
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), cuda::kRowThreads, 0, stream_>>>(x, weight, y, n_cols,
                                                                                    eps);
  launched("rms_norm");
}

}  // namespace ember
