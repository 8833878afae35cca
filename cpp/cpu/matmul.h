// cpu/matmul.h: the CPU matrix multiply with weights in any supported GGUF dtype.
// Owns the choice of kernel (per dtype and ISA) and the threading; knows nothing of models.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "quant/types.h"

namespace ember::cpu {

// y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ. W is n_out rows of n_in weights in `wtype` blocks
// along n_in (a GGUF tensor of shape {n_in, n_out}); x and y are row-major float32.
// n_in must be a multiple of wtype's block size. Never throws for a supported wtype.
void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out,
            const float* x, int64_t n_rows, float* y, ThreadPool& pool);

// True if matmul() accepts weights of this dtype.
bool matmul_supports(DType wtype);

// True if each row's result of matmul() with weights of this dtype is bit-identical whatever
// n_rows is (the active level's GEMM takes every row count; see TypeKernels::gemm_any_rows).
bool matmul_rows_exact(DType wtype);

}  // namespace ember::cpu
