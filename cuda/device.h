// cuda/device.h: what the CUDA op files share on the host side — error checks that turn a CUDA
// error into ember's exceptions, launch sizes, and the op codes of the elementwise kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/error.h"

namespace ember::cuda {

// Throws Error("[cuda] <what> on cuda:<index>: <error name> (<description>)") unless e is success.
inline void check(cudaError_t e, const char* what, int index) {
  if (e == cudaSuccess) return;
  throw Error(
      cat("[cuda] ", what, " on cuda:", index, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

inline unsigned blocks_for(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Whether this build has kernels for the current device (cudaErrorNoKernelImageForDevice if
// not): the attributes of one kernel (elementwise.cu).
cudaError_t probe_kernel_image();

// The elementwise kernel's ops (elementwise.cu).
enum ElementwiseOp : int { kAdd, kAddBias, kSiluMul, kGeluMul, kGelu, kScale, kSoftcap };

}  // namespace ember::cuda
