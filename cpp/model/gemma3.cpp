// model/gemma3.cpp: the Gemma 3 and Gemma 2 decoder — sandwich-normed blocks of grouped-query
// attention (Q/K norms in Gemma 3, soft-capped scores in Gemma 2, RoPE, local sliding-window
// layers between global ones) and a GeGLU feed-forward; Gemma 2 soft-caps the logits too.
// Reads top to bottom; every op goes through the Backend.
#include "model/gemma3.h"

#include <cmath>

#include "model/sequence_ops.h"

namespace ember {

void gemma3_forward(const Model& model, Scratch& s, const ForwardBatch& batch, float* logits) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  Backend& be = model.backend();
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
  be.scale(x, n * n_embd, std::sqrt(static_cast<float>(n_embd)));

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = w.layers[il];
    const bool last = il == c.n_layer - 1;
    const RopeParams rope = model.rope_params(il);
    const AttentionParams attention = attention_params(c, il);

    // --- attention: x += post_norm(wo · attention(rope(norm(q)), rope(norm(k)), v)), the Q/K
    // norms Gemma 3's only ---
    be.rms_norm(x, l.attn_norm.f32(), n, n_embd, c.rms_eps, xn);
    // q, k and v in one call; a chunk of a long prompt that wants no logits needs the last
    // layer only for its cache (k and v).
    const bool cache_only = last && batch.n_outputs == 0;
    const MatmulOut kvq[] = {l.wk.into(k), l.wv.into(v), l.wq.into(q)};
    be.matmul_many(kvq, cache_only ? 2 : 3, n_embd, xn, n);
    if (l.k_norm) be.rms_norm(k, l.k_norm.f32(), n * c.n_head_kv, c.head_dim, c.rms_eps, k);
    be.rope(k, n, c.n_head_kv, c.head_dim, batch.positions, rope);
    store_kv_of_sequences(be, batch, il, n_kv, k, v);
    if (cache_only) break;

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
    be.rms_norm(xn, l.post_attn_norm.f32(), n_rows, n_embd, c.rms_eps, xn);
    be.add(x, xn, n_rows * n_embd, x);

    // --- feed-forward: x += post_norm(down(gelu(gate(h)) * up(h))), h = norm(x) ---
    be.rms_norm(x, l.ffn_norm.f32(), n_rows, n_embd, c.rms_eps, xn);
    const MatmulOut gate_up[] = {l.ffn_gate.into(gate), l.ffn_up.into(up)};
    be.matmul_many(gate_up, 2, n_embd, xn, n_rows);
    be.gelu_mul(gate, up, n_rows * c.n_ff, gate);
    be.matmul(l.ffn_down.type, l.ffn_down.data, c.n_ff, n_embd, gate, n_rows, xn);
    be.rms_norm(xn, l.post_ffn_norm.f32(), n_rows, n_embd, c.rms_eps, xn);
    be.add(x, xn, n_rows * n_embd, x);
  }
  if (batch.n_outputs == 0) return;

  output_head(be, c, w, s, batch, x, xn, logits);  // x now holds exactly the output rows, in order
}

}  // namespace ember
