// cpu/matmul.h: the CPU matrix multiply with weights in any supported GGUF dtype.
// Owns the choice of kernel (per dtype and ISA) and the threading; knows nothing of models.
#pragma once

#include <cstdint>

#include "backend.h"
#include "core/thread_pool.h"
#include "cpu/matmul_workspace.h"
#include "quant/types.h"

namespace ember::cpu {

// y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ on the active ISA level's kernels. W is n_out rows of
// n_in weights in `wtype` blocks along n_in (a GGUF tensor of shape {n_in, n_out}); x and y are
// row-major float32. n_in must be a multiple of wtype's block size. Never throws for a supported
// wtype; allocates only if `workspace` holds less than matmul_workspace_bytes(n_rows, n_in, ...).
void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows, float* y,
            ThreadPool& pool, MatmulWorkspace& workspace);

// matmul() of one x[n_rows, n_in] by several weights, each output bit-identical to its own
// matmul() call. Weights whose kernels take x in the same form share one quantization of x and
// one job on the pool, each thread taking one contiguous share of all their weight bytes: a decode
// step's q, k and v projections (or gate and up) wait for the slowest thread once, not three
// times (or twice).
void matmul_many(const MatmulOut* outs, int n_outs, int64_t n_in, const float* x, int64_t n_rows,
                 ThreadPool& pool, MatmulWorkspace& workspace);

// True if matmul() accepts weights of this dtype.
bool matmul_supports(DType wtype);

// The smallest n_rows from which each row's result of matmul() with weights of this dtype is
// bit-identical whatever n_rows is; 1 where every row count gives the same bits (the active
// level's GEMM takes every row count, see TypeKernels::gemm_any_rows, or there is no GEMM).
int64_t matmul_exact_min_rows(DType wtype);

// Workspace bytes that let matmul() run calls of up to n_rows rows of up to n_in inputs on
// n_threads threads, for any weight type, without allocating.
int64_t matmul_workspace_bytes(int64_t n_rows, int64_t n_in, int n_threads);

}  // namespace ember::cpu
