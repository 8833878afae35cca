// model/sequence_ops.h: the steps of a forward pass that run per sequence of a batch (its rows
// write to and attend over its own cache), and the output head of the decoders (llama, gemma3),
// shared by the architectures' forward passes.
#pragma once

#include <cstdint>

#include "backend.h"
#include "model/config.h"
#include "model/run_state.h"
#include "model/weights.h"

namespace ember {

// The attention of layer il (heads, head size, q·k scale, soft-capping, its sliding window).
inline AttentionParams attention_params(const ModelConfig& c, int64_t il) {
  AttentionParams params;
  params.n_head = c.n_head;
  params.n_head_kv = c.n_head_kv;
  params.head_dim = c.head_dim;
  params.scale = c.attention_scale;
  params.softcap = c.attn_softcap;
  params.window = c.is_swa(il) ? c.sliding_window : 0;
  return params;
}

// k, v [n_tokens, n_kv]: each sequence's rows go into layer il of its cache at their positions.
inline void store_kv_of_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_kv,
                                  const float* k, const float* v) {
  for (int64_t is = 0; is < batch.n_seqs; ++is) {
    const SequenceRows& seq = batch.seqs[is];
    const int64_t r0 = seq.row_begin;
    be.store_kv(seq.layer(il, batch.kv_layer_stride), batch.positions + r0, seq.n_rows, n_kv, k + r0 * n_kv,
                v + r0 * n_kv);
  }
}

// out [n_tokens, n_q] = each sequence's rows of q [n_tokens, n_q] attending over layer il of its
// cache (which already holds those rows).
inline void attend_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_q,
                             const AttentionParams& params, const float* q, float* out) {
  for (int64_t is = 0; is < batch.n_seqs; ++is) {
    const SequenceRows& seq = batch.seqs[is];
    const int64_t r0 = seq.row_begin;
    be.attention(q + r0 * n_q, batch.positions + r0, seq.n_rows, seq.layer(il, batch.kv_layer_stride), params,
                 out + r0 * n_q);
  }
}

// The output head of x's rows, exactly the batch's output rows in order: the final norm (into xn),
// logits of the first batch.vocab_rows() tokens into host `logits` (soft-capped where the model
// caps them), and the normed states into batch.hidden when it is set.
inline void output_head(Backend& be, const ModelConfig& c, const ModelWeights& w, Scratch& s,
                        const ForwardBatch& batch, const float* x, float* xn, float* logits) {
  const int64_t n_vocab = batch.vocab_rows(c.n_vocab), n_logits = batch.n_outputs * n_vocab;
  be.rms_norm(x, w.output_norm.f32(), batch.n_outputs, c.n_embd, c.rms_eps, xn);
  be.matmul(w.output.type, w.output.data, c.n_embd, n_vocab, xn, batch.n_outputs, s.logits.as<float>());
  if (c.final_softcap > 0.0f) be.softcap(s.logits.as<float>(), n_logits, c.final_softcap);
  be.download(s.logits, 0, logits, sizeof(float) * static_cast<size_t>(n_logits));
  if (batch.hidden) {
    be.download(s.xn, 0, batch.hidden, sizeof(float) * static_cast<size_t>(batch.n_outputs * c.n_embd));
  }
}

}  // namespace ember
