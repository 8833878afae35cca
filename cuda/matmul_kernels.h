// cuda/matmul_kernels.h: the two matmul kernels of every weight type, launched by matmul.cu.
// Both read W in the file's layout ({n_in, n_out}: n_out rows of n_in values as blocks) and
// dequantize 32 values at a time in registers; x and y are f32 device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "quant/types.h"

namespace ember::cuda {

// y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ for few rows (decode): one warp per output, its lanes
// over the row's groups of 32, up to 4 rows of x per block. Returns false for a type without kernels.
bool matmul_vec(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
                float* y, cudaStream_t stream);

// The same for many rows (prefill): 64 x 64 output tiles, W and x staged through shared memory 64
// inputs at a time, each output summed over n_in in order — so a row's result never depends on
// how many rows are batched with it.
bool matmul_mat(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows,
                float* y, cudaStream_t stream);

}  // namespace ember::cuda
