// cuda/matmul_mat.cu: the tiled matrix-matrix kernel of every weight type (prefill: 32 rows and
// more). A block computes a 64 x 64 tile of y; per step of 64 inputs, 128 threads dequantize the
// tile's 64 weight rows (two groups of 32 each) into shared memory while the other 128 stage 64
// rows of x; then each thread accumulates a 4 x 4 patch of outputs in registers, summing over k
// in order.
#include "cuda/dequant.cuh"
#include "cuda/matmul_kernels.h"

namespace ember::cuda {

namespace {

constexpr int kTile = 64;  // rows of x and outputs per block
constexpr int kStep = 64;  // inputs per shared-memory step (two groups of 32)

// grid (ceil(n_out / 64), ceil(n_rows / 64)), block 256.
template <DType T>
__global__ void __launch_bounds__(256)
    matmul_mat_kernel(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                      int64_t n_in, int64_t n_out, int64_t n_rows) {
  __shared__ float ws[kTile][kStep + 1];  // [output][input] of this step
  __shared__ float xs[kTile][kStep + 1];  // [row][input]
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  const int64_t n0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  const int64_t n_groups = (n_in + 31) / 32;
  const int64_t row_bytes = Weight<T>::row_bytes(n_in);
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < n_in; k0 += kStep) {
    if (t < 128) {
      const int o = t / 2, half = t % 2;  // output o of the tile, group `half` of the step
      const int64_t g = k0 / 32 + half;
      float v[32];
      if (n0 + o < n_out && g < n_groups) {
        Weight<T>::dq32(w + (n0 + o) * row_bytes, g, n_in, v);
      } else {
#pragma unroll
        for (int l = 0; l < 32; ++l) v[l] = 0.0f;
      }
#pragma unroll
      for (int l = 0; l < 32; ++l) ws[o][32 * half + l] = v[l];
    } else {
      for (int i = t - 128; i < kTile * kStep; i += 128) {
        const int r = i / kStep, k = i % kStep;
        xs[r][k] = r0 + r < n_rows && k0 + k < n_in ? x[(r0 + r) * n_in + k0 + k] : 0.0f;
      }
    }
    __syncthreads();
    const int n_k = n_in - k0 < kStep ? static_cast<int>(n_in - k0) : kStep;
    for (int k = 0; k < n_k; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[ty + 16 * i][k];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[tx + 16 * j][k];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + ty + 16 * i;
    if (r >= n_rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < n_out) y[r * n_out + n] = acc[i][j];
    }
  }
}

}  // namespace

bool matmul_mat(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
                float* y, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n_out + kTile - 1) / kTile),
                  static_cast<unsigned>((n_rows + kTile - 1) / kTile));
  return with_weight_type(wtype, [&]<DType T>() {
    matmul_mat_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(w), x, y, n_in, n_out, n_rows);
  });
}

}  // namespace ember::cuda
