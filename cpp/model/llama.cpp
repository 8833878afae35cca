// model/llama.cpp: the llama-family decoder — pre-norm blocks of grouped-query attention with
// RoPE and a SwiGLU feed-forward (or a mixture of SwiGLU experts: model/moe.h). Reads top to
// bottom; every op goes through the Backend.
#include "model/llama.h"

#include "model/moe.h"
#include "model/sequence_ops.h"

namespace ember {

void llama_forward(const Model& model, Scratch& s, const ForwardBatch& batch, float* logits) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  Backend& be = model.backend();
  const RopeParams rope = model.rope_params();
  const int64_t n = batch.n_tokens, n_embd = c.n_embd, n_q = c.n_q_dim(), n_kv = c.n_kv_dim();

  float* x = s.x.as<float>();            // [n, n_embd] residual stream
  float* xn = s.xn.as<float>();          // [n, n_embd]
  float* q = s.q.as<float>();            // [n, n_q]
  float* k = s.k.as<float>();            // [n, n_kv]
  float* v = s.v.as<float>();            // [n, n_kv]
  float* attn = s.attn.as<float>();      // [n, n_q]
  float* gate = s.ffn_gate.as<float>();  // [n, n_ff]
  float* up = s.ffn_up.as<float>();      // [n, n_ff]

  be.get_rows(w.token_embd.type, w.token_embd.data, n_embd, batch.tokens, n, x);

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = w.layers[il];
    const bool last = il == c.n_layer - 1;
    const AttentionParams attention = attention_params(c, il);  // Mistral: every layer windowed

    // --- attention ---
    be.rms_norm(x, l.attn_norm.f32(), n, n_embd, c.rms_eps, xn);
    // q, k and v in one call; a chunk of a long prompt that wants no logits needs the last
    // layer only for its cache (k and v).
    const bool cache_only = last && batch.n_outputs == 0;
    const MatmulOut kvq[] = {l.wk.into(k), l.wv.into(v), l.wq.into(q)};
    be.matmul_many(kvq, cache_only ? 2 : 3, n_embd, xn, n);
    if (l.bk) be.add_bias(k, l.bk.f32(), n, n_kv);
    if (l.bv) be.add_bias(v, l.bv.f32(), n, n_kv);
    if (l.k_norm) be.rms_norm(k, l.k_norm.f32(), n * c.n_head_kv, c.head_dim, c.rms_eps, k);
    be.rope(k, n, c.n_head_kv, c.head_dim, batch.positions, rope);
    store_kv_of_sequences(be, batch, il, n_kv, k, v);
    if (cache_only) break;

    if (l.bq) be.add_bias(q, l.bq.f32(), n, n_q);
    if (l.q_norm) be.rms_norm(q, l.q_norm.f32(), n * c.n_head, c.head_dim, c.rms_eps, q);
    be.rope(q, n, c.n_head, c.head_dim, batch.positions, rope);
    attend_sequences(be, batch, il, n_q, attention, q, attn);

    // The last layer's projection and feed-forward only matter for the output rows: keep
    // those (rows [n_rows] from here on) and drop the rest.
    int64_t n_rows = n;
    float* attn_rows = attn;
    if (last && batch.n_outputs < n) {
      n_rows = batch.n_outputs;
      be.get_rows(DType::f32, attn, n_q, batch.output_rows, n_rows, q);
      be.get_rows(DType::f32, x, n_embd, batch.output_rows, n_rows, s.x_out.as<float>());
      attn_rows = q;
      x = s.x_out.as<float>();
    }
    be.matmul(l.wo.type, l.wo.data, n_q, n_embd, attn_rows, n_rows, xn);
    be.add(x, xn, n_rows * n_embd, x);

    // --- feed-forward: down(silu(gate(h)) * up(h)) ---
    be.rms_norm(x, l.ffn_norm.f32(), n_rows, n_embd, c.rms_eps, xn);
    if (l.moe) {  // a mixture of experts adds its output to x itself
      moe_feed_forward(be, c, l.moe, s.moe, xn, n_rows, x);
      continue;
    }
    const MatmulOut gate_up[] = {l.ffn_gate.into(gate), l.ffn_up.into(up)};
    be.matmul_many(gate_up, 2, n_embd, xn, n_rows);
    be.silu_mul(gate, up, n_rows * c.n_ff, gate);
    be.matmul(l.ffn_down.type, l.ffn_down.data, c.n_ff, n_embd, gate, n_rows, xn);
    be.add(x, xn, n_rows * n_embd, x);
  }
  if (batch.n_outputs == 0) return;

  output_head(be, c, w, s, batch, x, xn, logits);  // x now holds exactly the output rows, in order
}

}  // namespace ember
