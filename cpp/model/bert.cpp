// model/bert.cpp: the BERT encoder — token, position and token-type embeddings summed and
// LayerNormed, then post-norm blocks of bidirectional multi-head attention and a GELU
// feed-forward, every projection with a bias. Reads top to bottom; every op goes through the
// Backend. Pooling and normalisation of the token states are the embedder's (model/embedder.h).
#include "model/bert.h"

#include "model/blocks.h"

namespace ember {

void bert_forward(const Model& model, Scratch& s, const ForwardBatch& batch, float* states) {
  ForwardPass p(model, s, batch);
  const ModelConfig& c = p.c;
  const ModelWeights& w = p.w;
  Backend& be = p.be;
  const int64_t n = p.n, n_embd = p.n_embd, n_q = p.n_q, n_kv = p.n_kv;
  const float eps = c.layer_norm_eps;
  const AttentionParams attention = attention_params(c, /*il=*/0);  // every layer alike
  float* x = p.x;                                                   // [n, n_embd] residual stream
  float* xn = p.xn;                                                 // [n, n_embd]
  float* up = p.up;                                                 // [n, n_ff]

  // The attention op sees keys up to a row's bound, so bounding every row by its sequence's last
  // position makes it bidirectional.
  int32_t* key_bounds = s.key_bounds.data();
  for (int64_t is = 0; is < batch.n_seqs; ++is) {
    const SequenceRows& seq = batch.seqs[is];
    for (int64_t r = seq.row_begin; r < seq.row_begin + seq.n_rows; ++r) {
      key_bounds[r] = batch.positions[seq.row_begin + seq.n_rows - 1];
    }
  }

  // --- embeddings: norm(token + position + token type) ---
  be.get_rows(w.token_embd.type, w.token_embd.data, n_embd, batch.tokens, n, x);
  be.get_rows(w.position_embd.type, w.position_embd.data, n_embd, batch.positions, n, xn);
  be.add(x, xn, n * n_embd, x);
  be.get_rows(w.token_types.type, w.token_types.data, n_embd, s.token_types.data(), n, xn);
  be.add(x, xn, n * n_embd, x);
  be.layer_norm(x, w.token_embd_norm.f32(), w.token_embd_norm_b.f32(), n, n_embd, eps, x);

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = w.layers[il];

    // --- attention: x = norm(x + wo · attention(q, k, v) + bo) ---
    const MatmulOut qkv[] = {l.wq.into(p.q), l.wk.into(p.k), l.wv.into(p.v)};
    be.matmul_many(qkv, 3, n_embd, x, n);
    be.add_bias(p.q, l.bq.f32(), n, n_q);
    be.add_bias(p.k, l.bk.f32(), n, n_kv);
    be.add_bias(p.v, l.bv.f32(), n, n_kv);
    store_kv_of_sequences(be, batch, il, n_kv, p.k, p.v);
    attend_sequences(be, batch, il, n_q, attention, p.q, p.attn, key_bounds);
    be.matmul(l.wo.type, l.wo.data, n_q, n_embd, p.attn, n, xn);
    be.add_bias(xn, l.bo.f32(), n, n_embd);
    be.add(x, xn, n * n_embd, x);
    be.layer_norm(x, l.post_attn_norm.f32(), l.post_attn_norm_b.f32(), n, n_embd, eps, x);

    // --- feed-forward: x = norm(x + down(gelu(up(x) + b_up)) + b_down) ---
    be.matmul(l.ffn_up.type, l.ffn_up.data, n_embd, c.n_ff, x, n, up);
    be.add_bias(up, l.ffn_up_b.f32(), n, c.n_ff);
    be.gelu(up, n * c.n_ff, up);
    be.matmul(l.ffn_down.type, l.ffn_down.data, c.n_ff, n_embd, up, n, xn);
    be.add_bias(xn, l.ffn_down_b.f32(), n, n_embd);
    be.add(x, xn, n * n_embd, x);
    be.layer_norm(x, l.post_ffn_norm.f32(), l.post_ffn_norm_b.f32(), n, n_embd, eps, x);
  }
  if (batch.n_outputs == 0) return;
  be.get_rows(DType::f32, x, n_embd, batch.output_rows, batch.n_outputs, s.logits.as<float>());
  be.download(s.logits, 0, states, sizeof(float) * static_cast<size_t>(batch.n_outputs * n_embd));
}

}  // namespace ember
