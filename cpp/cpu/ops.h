// cpu/ops.h: the CPU implementations of backend.h's ops other than matmul (cpu/matmul.h), one
// file each (get_rows.cpp, low_rank.cpp, rms_norm.cpp, layer_norm.cpp, rope.cpp, elementwise.cpp,
// softmax.cpp, store_kv.cpp, attention.cpp), threaded on the caller's pool. Shapes and semantics are those of
// backend.h.
#pragma once

#include <cstdint>

#include "backend.h"
#include "core/thread_pool.h"
#include "cpu/matmul_workspace.h"
#include "quant/types.h"

namespace ember::cpu {

// The per-ISA inner kernels that silu_mul, store_kv and attention call (op_kernels.h); the
// backend picks one table when it is made.
struct OpKernels;

// y[n_ids, n_cols] = rows ids[] of table {n_cols, *} of `type`, dequantized.
void get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* y,
              ThreadPool& pool);

// y[n_rows, n_cols] = x / rms(x) * weight[n_cols]; y may alias x.
void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps, float* y,
              ThreadPool& pool);

// y[n_rows, n_cols] = LayerNorm of each row of x with weight[n_cols] and bias[n_cols]; y may alias x.
void layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows, int64_t n_cols,
                float eps, float* y, ThreadPool& pool);

// x[n_rows, n_heads, head_dim] rotated in place by positions[n_rows].
void rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const int32_t* positions,
          const RopeParams& params, ThreadPool& pool);

// y[n] = a[n] + b[n].
void add(const float* a, const float* b, int64_t n, float* y, ThreadPool& pool);
// x[n_rows, n_cols] += bias[n_cols].
void add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols, ThreadPool& pool);
// y[n] = silu(gate[n]) * up[n].
void silu_mul(const float* gate, const float* up, int64_t n, float* y, const OpKernels& kernels,
              ThreadPool& pool);
// y[n] = gpt-oss's clamped SwiGLU of gate[n] and up[n] (backend.h).
void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y,
                ThreadPool& pool);
// y[n] = gelu_tanh(gate[n]) * up[n] (GeGLU).
void gelu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool);
// y[n] = gelu_erf(x[n]).
void gelu(const float* x, int64_t n, float* y, ThreadPool& pool);
// y[ids[i], :] += scales[i] * x[i, :] for i in order; x [n_ids, n_cols].
void add_rows_scaled(const float* x, const int32_t* ids, const float* scales, int64_t n_ids, int64_t n_cols,
                     float* y, ThreadPool& pool);
// The groups' low-rank products added to the outputs' rows (Backend::add_low_rank), in two
// jobs; the GEMM panels come from `workspace`.
void add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                  const float* x, int64_t n_in, const LowRankScratch& scratch, ThreadPool& pool,
                  MatmulWorkspace& workspace);
// x[n] *= s.
void scale(float* x, int64_t n, float s, ThreadPool& pool);
// x[n] = cap * tanh(x[n] / cap)
void softcap(float* x, int64_t n, float cap, ThreadPool& pool);

// x[n_rows, n_cols] = softmax over each row, in place.
void softmax(float* x, int64_t n_rows, int64_t n_cols, ThreadPool& pool);

// k, v [n_rows, n_kv_dim] f32 -> the cache slots of positions[n_rows], as kv.type (f16 or q8_0).
// Slots [0, n_slots) of block src_block to block dst_block, K and V, every kv head (backend.h).
void copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots);
void store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim, const float* k,
              const float* v, const OpKernels& kernels, ThreadPool& pool);

// out[n_rows, n_head * head_dim] = causal attention of q over kv (see backend.h).
void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
               const AttentionParams& params, float* out, const OpKernels& kernels, ThreadPool& pool);

}  // namespace ember::cpu
