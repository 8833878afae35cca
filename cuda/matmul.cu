// cuda/matmul.cu: y = x · Wᵀ as matmul_vec (under 32 rows: decode) or matmul_mat (prefill); for
// quantized weights x is first rounded to 8 bits per block of 32 as the CPU backend rounds it
// (cpu/quantize_act.cpp: d = amax / 127, q = round-to-even(x / d)), written back as the f32
// values d * q into the backend's activation scratch: matmuls with quantized weights then see
// the activations the CPU sees.
#include "cuda/backend_cuda.h"
#include "cuda/device.h"
#include "cuda/matmul_kernels.h"

namespace ember {

namespace {

constexpr int64_t kMatMatMinRows = 32;

bool quantizes_activations(DType t) { return t != DType::f32 && t != DType::f16 && t != DType::bf16; }

// x[n_blocks * 32] -> y, one thread per block of 32.
__global__ void quantize_act_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n_blocks) {
  const int64_t b = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const float* xb = x + 32 * b;
  float amax = 0.0f;
  for (int l = 0; l < 32; ++l) amax = fmaxf(amax, fabsf(xb[l]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int l = 0; l < 32; ++l) y[32 * b + l] = __fmul_rn(rintf(__fmul_rn(xb[l], id)), d);
}

}  // namespace

// The vec and mat kernels sum in different orders; from kMatMatMinRows rows on every call runs
// matmul_mat, whose rows never depend on the others.
int64_t CudaBackend::matmul_exact_min_rows(DType) const { return kMatMatMinRows; }

void CudaBackend::reserve_matmul(int64_t max_rows, int64_t max_n_in) {
  const size_t n_bytes = sizeof(float) * static_cast<size_t>(max_rows * max_n_in);
  if (n_bytes > act_.n_bytes()) act_ = alloc(n_bytes);
}

void CudaBackend::matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x,
                         int64_t n_rows, float* y) {
  if (n_rows == 0 || n_out == 0) return;
  use();
  if (quantizes_activations(wtype)) {
    if (act_.n_bytes() < sizeof(float) * static_cast<size_t>(n_rows * n_in)) {
      throw std::logic_error(cat("[cuda] matmul of ", n_rows, "x", n_in, " past reserve_matmul"));
    }
    const int64_t n_blocks = n_rows * n_in / 32;
    quantize_act_kernel<<<cuda::blocks_for(n_blocks, 128), 128, 0, stream_>>>(x, act_.as<float>(), n_blocks);
    x = act_.as<float>();
  }
  const bool known = n_rows < kMatMatMinRows ? cuda::matmul_vec(wtype, w, n_in, n_out, x, n_rows, y, stream_)
                                             : cuda::matmul_mat(wtype, w, n_in, n_out, x, n_rows, y, stream_);
  if (!known)
    throw std::logic_error(cat("[cuda] matmul of ", dtype_name(wtype), " weights (see supports())"));
  launched("matmul");
}

}  // namespace ember
