// cpu/op_kernels.h: the per-ISA inner kernels of the ops (attention.cpp, store_kv.cpp,
// elementwise.cpp). Private to cpu/: the *_avx2 variants live in *_avx2.cpp files compiled with
// AVX2/FMA/F16C flags and are only called when OpsIsa::avx2_f16c says the CPU has them; the
// *_avx512 ones likewise behind OpsIsa::avx512.
#pragma once

#include <cstdint>

#include "backend.h"

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
  float softcap = 0.0f;  // > 0: scaled scores s become softcap * tanh(s / softcap)
  int64_t window = 0;    // > 0: a row at position p sees keys p - window + 1 .. p only
  // whole: the result into out; chunk: chunk `chunk`'s softmax state into partial (max, sum and
  // acc of the n_rows * n_heads queries, in kMaxBlockQueries * (head_dim + 2) floats); merge: the
  // result of the n_chunks states one after the other in partial.
  AttentionMode mode = AttentionMode::whole;
  int64_t chunk = 0, n_chunks = 0;
  float* partial = nullptr;
};
void attention_block_scalar(const AttentionBlock& block, const KVView& kv);
// head_dim a multiple of 8.
void attention_block_avx2(const AttentionBlock& block, const KVView& kv);
// The same bits as attention_block_avx2, faster where two queries see the same keys; head_dim a
// multiple of 8.
void attention_block_avx512(const AttentionBlock& block, const KVView& kv);

// dst = n / 32 q8_0 blocks of src[n], byte for byte as the reference quantize_row_q8_0 (which
// handles the blocks with inf or NaN values, or too small to invert their scale).
void quantize_row_q8_0_avx2(const float* src, void* dst, int64_t n);

// dst[n] = f16 of src[n], rounding to nearest even. The avx2 variant needs n % 8 == 0.
void f32_to_f16_row_scalar(const float* src, uint16_t* dst, int64_t n);
void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n);

// y[n] = silu(gate[n]) * up[n].
void silu_mul_scalar(const float* gate, const float* up, int64_t n, float* y);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* y);

}  // namespace ember::cpu
