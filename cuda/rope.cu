// cuda/rope.cu: rotary position embedding in place (one thread per rotated pair).
#include "cuda/backend_cuda.h"
#include "cuda/device.h"

namespace ember {

namespace {

// Rotates pair `pair` of head (r, h) of x[n_rows, n_heads, head_dim] by positions[r] *
// inv_freq[pair] (the f32 product, as on the CPU), cos and sin both scaled by mscale (LongRoPE's
// attention factor); the pair is (2i, 2i+1) or, neox, (i, i + n_pairs).
__global__ void rope_kernel(float* x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, int64_t n_rows, int64_t n_heads,
                            int64_t head_dim, int64_t n_pairs, bool neox, float mscale) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_heads * n_pairs) return;
  const int64_t pair = i % n_pairs, rh = i / n_pairs, r = rh / n_heads;
  const float theta = __fmul_rn(static_cast<float>(positions[r]), inv_freq[pair]);
  float s, c;
  sincosf(theta, &s, &c);
  s = __fmul_rn(s, mscale);
  c = __fmul_rn(c, mscale);
  float* a = x + rh * head_dim + (neox ? pair : 2 * pair);
  float* b = a + (neox ? n_pairs : 1);
  const float a0 = *a, b0 = *b;
  *a = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, s));
  *b = __fadd_rn(__fmul_rn(a0, s), __fmul_rn(b0, c));
}

}  // namespace

void CudaBackend::rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
                       const RopeParams& params) {
  const int64_t n_pairs = params.n_rot / 2;
  if (n_pairs == 0 || n_rows == 0) return;
  use();
  const int32_t* device_positions = argument(positions, n_rows);
  const float* device_inv_freq = argument(params.inv_freq, n_pairs);
  rope_kernel<<<cuda::blocks_for(n_rows * n_heads * n_pairs, 256), 256, 0, stream_>>>(
      x, device_positions, device_inv_freq, n_rows, n_heads, head_dim, n_pairs,
      params.layout == RopeLayout::neox, params.mscale);
  launched("rope");
}

}  // namespace ember
