// model/blocks.h: the forward-pass pieces the architectures share (llama.cpp, gemma3.cpp,
// bert.cpp): one pass's views of its scratch, the per-sequence cache steps, a decoder layer's
// attention half and gated feed-forward, and the decoders' output head. Each architecture file
// keeps only the order and the pieces that are its own; every op goes through the Backend.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/run_state.h"
#include "model/weights.h"

namespace ember {

// One forward pass: the model's parts, the batch, and the scratch buffers as f32 rows.
struct ForwardPass {
  const ModelConfig& c;
  const ModelWeights& w;
  Backend& be;
  Scratch& s;
  const ForwardBatch& batch;
  int64_t n, n_embd, n_q, n_kv;  // n: the batch's rows; the widths of x, q and k (v)

  float* x;     // [n, n_embd] residual stream (the last layer: its output rows only, see keep_output_rows)
  float* xn;    // [n, n_embd] normed block input, then a block's output
  float* q;     // [n, n_q]
  float* k;     // [n, n_kv]
  float* v;     // [n, n_kv]
  float* attn;  // [n, n_q] attention output, heads concatenated
  float* gate;  // [n, n_ff]
  float* up;    // [n, n_ff]
  // The rows that run with a LoRA adapter, grouped (all rows, then the last layer's output
  // rows: keep_output_rows); nullptr when no row has one.
  const LoraRows* lora = nullptr;

  ForwardPass(const Model& model, Scratch& scratch, const ForwardBatch& forward_batch);
};

// The rows the batch gives as embeddings (ForwardBatch::embeddings) replace their token
// lookups in p.x: uploaded through p.xn (free until the first layer), then one get_rows per run
// of consecutive rows. Call after the lookup and any scaling of it; a no-op without them.
void place_embeddings(ForwardPass& p);

// The attention of layer il (heads, head size, q·k scale, soft-capping, its sliding window).
AttentionParams attention_params(const ModelConfig& c, int64_t il);

// k, v [n_tokens, n_kv]: each sequence's rows go into layer il of its cache at their positions.
void store_kv_of_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_kv, const float* k,
                           const float* v);

// out [n_tokens, n_q] = each sequence's rows of q [n_tokens, n_q] attending over layer il of its
// cache (which already holds those rows) up to key_bounds[row] (nullptr: the row's position).
void attend_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_q,
                      const AttentionParams& params, const float* q, float* out,
                      const int32_t* key_bounds = nullptr);

// The attention half of decoder layer il (llama, gemma3), with h = attn_norm(x):
//   x += post_attn_norm(wo · attention(rope(q_norm(wq·h + bq)), rope(k_norm(wk·h + bk)), wv·h + bv) + bo)
// (attention with the layer's sinks where it has them), where the layer lacks a bias or norm, that step is
// left out, and a NoPE layer (SmolLM3) rotates neither q nor k. Returns the rows the layer goes on with
// (keep_output_rows), 0 where a last layer that wants no logits only filled the cache.
int64_t decoder_attention(ForwardPass& p, int64_t il, const RopeParams& rope);

// matmul of layer il's projection `target` into y [rows, n_out] from x [rows, n_in], then each
// adapted row's LoRA product added (add_lora over p.lora).
void project(ForwardPass& p, int64_t il, LoraTarget target, const WeightTensor& w, const float* x,
             int64_t n_rows, float* y);
// The LoRA products of the outputs of a matmul_many of x [rows, n_in] (no-op without adapted rows).
void add_lora_of(ForwardPass& p, int64_t il, std::initializer_list<LoraOut> outs, const float* x,
                 int64_t n_in);

// The rows a layer's projection and feed-forward still need: every row, except in the last layer,
// where only the batch's output rows matter; there p.x and p.attn become copies of those rows,
// in order (so the output head reads exactly them).
int64_t keep_output_rows(ForwardPass& p, bool last);

// x[n_rows] += post_ffn_norm(down(act(gate · h) * (up · h))) of layer il, with the rows' LoRA
// products, h = xn[n_rows] (the normed x); act is SwiGLU's silu or GeGLU's gelu_tanh; without
// post_ffn_norm that step is left out.
enum class GatedUnit { silu, gelu };
void gated_feed_forward(ForwardPass& p, int64_t il, int64_t n_rows, GatedUnit unit);

// The output head of x's rows, exactly the batch's output rows in order: the final norm (into xn),
// logits of the first batch.vocab_rows() tokens into host `logits` (soft-capped where the model
// caps them), and the normed states into batch.hidden when it is set. A states scratch
// (Scratch::states) gets the normed states into `logits` instead, and no logits.
void output_head(ForwardPass& p, float* logits);

}  // namespace ember
