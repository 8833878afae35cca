// cpu/op_kernels.h: the per-ISA kernel table of the ops other than matmul (attention.cpp,
// store_kv.cpp, elementwise.cpp), as cpu/matmul_kernels.h is matmul's. Private to cpu/: the *_avx2
// and *_avx512 kernels live in x86/ files compiled with their ISA's flags and are reached only
// through the table of a level the CPU runs.
#pragma once

#include <cstdint>

#include "backend.h"
#include "cpu/cpu_features.h"

namespace ember::cpu {

// Attention of rows [n_rows] of one sequence x the query heads [head_begin, + n_heads) of one
// kv head (n_rows * n_heads <= kMaxBlockQueries): out = softmax(cap(scale * q·Kᵀ)) · V over each
// row's keys, cap(s) = softcap * tanh(s / softcap) when softcap > 0 (else s), reading the
// head_dim values at kv_offset of each cached row, f16 or q8_0 (kv.type; q8_0 needs head_dim and
// kv_offset multiples of 32). Accumulates in f32. See attention_block.h.
inline constexpr int64_t kMaxBlockQueries = 32;
// Keys per chunk of attention_block's softmax (attention_block.h).
inline constexpr int64_t kKeyChunk = 256;

enum class AttentionMode { whole, chunk, merge };

struct AttentionBlock {
  const float* q = nullptr;            // [n_rows, row_stride] query rows of the block
  float* out = nullptr;                // [n_rows, row_stride] attention output rows of the block
  int64_t row_stride = 0;              // n_head * head_dim
  const int32_t* positions = nullptr;  // [n_rows]
  int64_t n_rows = 0;
  int64_t head_begin = 0;
  int64_t n_heads = 0;
  int64_t kv_head = 0;  // the kv head the block's query heads read
  int64_t head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;          // > 0: scaled scores s become softcap * tanh(s / softcap)
  int64_t window = 0;            // > 0: a row at position p sees keys p - window + 1 .. p only
  const float* sinks = nullptr;  // [n_head] or nullptr: each head's sink logit (AttentionParams)
  // whole: the result into out; chunk: chunk `chunk`'s softmax state into partial (max, sum and
  // acc of the n_rows * n_heads queries, in kMaxBlockQueries * (head_dim + 2) floats); merge: the
  // result of the n_chunks states one after the other in partial.
  AttentionMode mode = AttentionMode::whole;
  int64_t chunk = 0, n_chunks = 0;
  float* partial = nullptr;
};
// attention_block, f32_to_f16_row, quantize_row_q8_0 and silu_mul of one ISA level: filled once per
// level (op_kernels.cpp, x86/op_kernels_x86.cpp), looked up through the registry
// (isa_registry.cpp) and chosen when the backend is made (CpuBackend: active_op_kernels()). The ops
// call through it (one indirect call per op or per task, never per element), so no op file knows
// which ISA files this build has.
struct OpKernels {
  IsaLevel level = IsaLevel::scalar;
  // The vector kernels below take rows of head_dim (attention_block, f32_to_f16_row) a multiple of
  // this only; an op with other rows uses the scalar table (for_rows).
  int64_t row_multiple = 1;
  void (*attention_block)(const AttentionBlock& block, const KVView& kv) = nullptr;
  // dst[n] = f16 of src[n], rounding to nearest even.
  void (*f32_to_f16_row)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  // dst = n / 32 q8_0 blocks of src[n], byte for byte as the reference quantize_row_q8_0 (which
  // handles the blocks with inf or NaN values, or too small to invert their scale).
  void (*quantize_row_q8_0)(const float* src, void* dst, int64_t n) = nullptr;
  // y[n] = silu(gate[n]) * up[n].
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* y) = nullptr;

  // This table, or the scalar one where its vector kernels cannot take rows of n elements.
  const OpKernels& for_rows(int64_t n) const;
};

// The table of one ISA level; nullptr if this build has none for it (an ISA of another
// architecture). The AMX level's is AVX-512's, NEON's the scalar one. Does not check the CPU.
const OpKernels* op_kernels(IsaLevel level);
// The table of active_isa_level() (scalar where this build lacks it).
const OpKernels& active_op_kernels();

// Per-ISA tables, defined with their ISA's files (only those built for this architecture exist).
const OpKernels& op_kernels_scalar();
const OpKernels& op_kernels_avx2();
const OpKernels& op_kernels_avx512();

// The kernels the tables hold (op_kernels_x86.cpp and op_kernels.cpp fill them).
void attention_block_scalar(const AttentionBlock& block, const KVView& kv);
// head_dim a multiple of 8.
void attention_block_avx2(const AttentionBlock& block, const KVView& kv);
// The same bits as attention_block_avx2, faster where two queries see the same keys; head_dim a
// multiple of 8.
void attention_block_avx512(const AttentionBlock& block, const KVView& kv);
void quantize_row_q8_0_avx2(const float* src, void* dst, int64_t n);
void f32_to_f16_row_scalar(const float* src, uint16_t* dst, int64_t n);
void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n);  // n % 8 == 0
void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* y);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* y);

}  // namespace ember::cpu
