// cuda/matmul_vec.cu: the matrix-vector kernel of every weight type (decode: under 32 rows).
// Decode is bound by reading the weights once: each warp streams one weight row, its lanes taking
// consecutive blocks (so a warp's loads cover adjacent memory), and reuses each dequantized group
// for up to kRows activation rows.
#include "cuda/dequant.cuh"
#include "cuda/matmul_kernels.h"

namespace ember::cuda {

namespace {

constexpr int kWarps = 4;  // outputs per block
constexpr int kRows = 4;   // activation rows per block

// grid (ceil(n_out / kWarps), ceil(n_rows / kRows)), block 32 * kWarps.
template <DType T>
__global__ void __launch_bounds__(32 * kWarps)
    matmul_vec_kernel(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                      int64_t n_in, int64_t n_out, int64_t n_rows) {
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  const int64_t r0 = int64_t{blockIdx.y} * kRows;
  if (n >= n_out) return;
  const int n_r = static_cast<int>(n_rows - r0 < kRows ? n_rows - r0 : kRows);
  const uint8_t* row = w + n * Weight<T>::row_bytes(n_in);
  float acc[kRows] = {};
  const int64_t n_groups = (n_in + 31) / 32;
  for (int64_t g = lane; g < n_groups; g += 32) {
    float v[32];
    Weight<T>::dq32(row, g, n_in, v);
    // Only float types have rows that end inside a group.
    const bool whole = !Weight<T>::kPartialGroups || 32 * g + 32 <= n_in;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= n_r) break;
      const float* xr = x + (r0 + r) * n_in + 32 * g;
      if constexpr (!Weight<T>::kPartialGroups) {
        // x is the activation scratch (matmul.cu) and n_in a multiple of 32: 16-byte aligned, so
        // a lane reads its 32 values in 8 loads (the sum's order is unchanged).
        const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float4 a = x4[q];
          acc[r] = fmaf(v[4 * q], a.x, acc[r]);
          acc[r] = fmaf(v[4 * q + 1], a.y, acc[r]);
          acc[r] = fmaf(v[4 * q + 2], a.z, acc[r]);
          acc[r] = fmaf(v[4 * q + 3], a.w, acc[r]);
        }
      } else if (whole) {
#pragma unroll
        for (int l = 0; l < 32; ++l) acc[r] = fmaf(v[l], xr[l], acc[r]);
      } else {
        for (int l = 0; l < n_in - 32 * g; ++l) acc[r] = fmaf(v[l], xr[l], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float s = acc[r];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0 && r < n_r) y[(r0 + r) * n_out + n] = s;
  }
}

}  // namespace

bool matmul_vec(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
                float* y, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n_out + kWarps - 1) / kWarps),
                  static_cast<unsigned>((n_rows + kRows - 1) / kRows));
  return with_weight_type(wtype, [&]<DType T>() {
    matmul_vec_kernel<T>
        <<<grid, 32 * kWarps, 0, stream>>>(static_cast<const uint8_t*>(w), x, y, n_in, n_out, n_rows);
  });
}

}  // namespace ember::cuda
