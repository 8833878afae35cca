// model/blocks.cpp: the forward-pass pieces the architectures share (see blocks.h).
#include "model/blocks.h"

namespace ember {

ForwardPass::ForwardPass(const Model& model, Scratch& scratch, const ForwardBatch& forward_batch)
    : c(model.config()),
      w(model.weights()),
      be(model.backend()),
      s(scratch),
      batch(forward_batch),
      n(forward_batch.n_tokens),
      n_embd(c.n_embd),
      n_q(c.n_q_dim()),
      n_kv(c.n_kv_dim()),
      x(scratch.x.as<float>()),
      xn(scratch.xn.as<float>()),
      q(scratch.q.as<float>()),
      k(scratch.k.as<float>()),
      v(scratch.v.as<float>()),
      attn(scratch.attn.as<float>()),
      gate(scratch.ffn_gate.as<float>()),
      up(scratch.ffn_up.as<float>()) {
  if (forward_batch.n_adapters > 0) {
    scratch.lora.all_rows.build(forward_batch, nullptr, n, forward_batch.lora_row_at_a_time);
    if (!scratch.lora.all_rows.empty()) lora = &scratch.lora.all_rows;
  }
}

void add_lora_of(ForwardPass& p, int64_t il, std::initializer_list<LoraOut> outs, const float* x,
                 int64_t n_in) {
  if (p.lora)
    add_lora(p.be, p.batch, p.s.lora, *p.lora, il, outs.begin(), static_cast<int>(outs.size()), x, n_in);
}

void project(ForwardPass& p, int64_t il, LoraTarget target, const WeightTensor& w, const float* x,
             int64_t n_rows, float* y) {
  p.be.matmul(w.type, w.data, w.ne0, w.ne1, x, n_rows, y);
  add_lora_of(p, il, {{target, y, w.ne1}}, x, w.ne0);
}

void place_embeddings(ForwardPass& p) {
  const RowEmbeddings* e = p.batch.embeddings;
  if (!e || e->n_rows == 0) return;
  p.be.upload(p.s.xn, 0, e->data, sizeof(float) * static_cast<size_t>(e->n_rows * p.n_embd));
  for (int64_t i = 0; i < e->n_rows;) {
    int64_t j = i + 1;
    while (j < e->n_rows && e->rows[j] == e->rows[j - 1] + 1) ++j;
    p.be.get_rows(DType::f32, p.xn + i * p.n_embd, p.n_embd, p.s.row_ids.data(), j - i,
                  p.x + e->rows[i] * p.n_embd);
    i = j;
  }
}

AttentionParams attention_params(const ModelConfig& c, int64_t il) {
  AttentionParams params;
  params.n_head = c.n_head;
  params.n_head_kv = c.n_head_kv;
  params.head_dim = c.head_dim;
  params.scale = c.attention_scale;
  params.softcap = c.attn_softcap;
  params.window = c.is_swa(il) ? c.sliding_window : 0;
  return params;
}

void store_kv_of_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_kv, const float* k,
                           const float* v) {
  for (int64_t is = 0; is < batch.n_seqs; ++is) {
    const SequenceRows& seq = batch.seqs[is];
    const int64_t r0 = seq.row_begin;
    be.store_kv(seq.layer(il, batch.kv_layer_stride), batch.positions + r0, seq.n_rows, n_kv, k + r0 * n_kv,
                v + r0 * n_kv);
  }
}

void attend_sequences(Backend& be, const ForwardBatch& batch, int64_t il, int64_t n_q,
                      const AttentionParams& params, const float* q, float* out, const int32_t* key_bounds) {
  const int32_t* bounds = key_bounds ? key_bounds : batch.positions;
  for (int64_t is = 0; is < batch.n_seqs; ++is) {
    const SequenceRows& seq = batch.seqs[is];
    const int64_t r0 = seq.row_begin;
    be.attention(q + r0 * n_q, bounds + r0, seq.n_rows, seq.layer(il, batch.kv_layer_stride), params,
                 out + r0 * n_q);
  }
}

int64_t decoder_attention(ForwardPass& p, int64_t il, const RopeParams& rope) {
  const ModelConfig& c = p.c;
  const LayerWeights& l = p.w.layers[il];
  Backend& be = p.be;
  const int64_t n = p.n;
  const bool last = il == c.n_layer - 1;

  be.rms_norm(p.x, l.attn_norm.f32(), n, p.n_embd, c.rms_eps, p.xn);
  // q, k and v in one call; a chunk of a long prompt that wants no logits needs the last layer
  // only for its cache (k and v).
  const bool cache_only = last && p.batch.n_outputs == 0;
  const MatmulOut kvq[] = {l.wk.into(p.k), l.wv.into(p.v), l.wq.into(p.q)};
  be.matmul_many(kvq, cache_only ? 2 : 3, p.n_embd, p.xn, n);
  if (cache_only) {
    add_lora_of(p, il, {{LoraTarget::k, p.k, p.n_kv}, {LoraTarget::v, p.v, p.n_kv}}, p.xn, p.n_embd);
  } else {
    add_lora_of(p, il,
                {{LoraTarget::k, p.k, p.n_kv}, {LoraTarget::v, p.v, p.n_kv}, {LoraTarget::q, p.q, p.n_q}},
                p.xn, p.n_embd);
  }
  if (l.bk) be.add_bias(p.k, l.bk.f32(), n, p.n_kv);
  if (l.bv) be.add_bias(p.v, l.bv.f32(), n, p.n_kv);
  if (l.k_norm) be.rms_norm(p.k, l.k_norm.f32(), n * c.n_head_kv, c.head_dim, c.rms_eps, p.k);
  const bool rotate = c.uses_rope(il);  // SmolLM3's NoPE layers attend without positions
  if (rotate) be.rope(p.k, n, c.n_head_kv, c.head_dim, p.batch.positions, rope);
  store_kv_of_sequences(be, p.batch, il, p.n_kv, p.k, p.v);
  if (cache_only) return 0;

  if (l.bq) be.add_bias(p.q, l.bq.f32(), n, p.n_q);
  if (l.q_norm) be.rms_norm(p.q, l.q_norm.f32(), n * c.n_head, c.head_dim, c.rms_eps, p.q);
  if (rotate) be.rope(p.q, n, c.n_head, c.head_dim, p.batch.positions, rope);
  AttentionParams params = attention_params(c, il);
  params.sinks = l.attn_sinks ? l.attn_sinks.f32() : nullptr;
  attend_sequences(be, p.batch, il, p.n_q, params, p.q, p.attn, p.batch.key_bounds);

  const int64_t n_rows = keep_output_rows(p, last);
  project(p, il, LoraTarget::o, l.wo, p.attn, n_rows, p.xn);
  if (l.bo) be.add_bias(p.xn, l.bo.f32(), n_rows, p.n_embd);
  if (l.post_attn_norm) be.rms_norm(p.xn, l.post_attn_norm.f32(), n_rows, p.n_embd, c.rms_eps, p.xn);
  be.add(p.x, p.xn, n_rows * p.n_embd, p.x);
  return n_rows;
}

int64_t keep_output_rows(ForwardPass& p, bool last) {
  if (!last || p.batch.n_outputs >= p.n) return p.n;
  const int64_t n_rows = p.batch.n_outputs;
  p.be.get_rows(DType::f32, p.attn, p.n_q, p.batch.output_rows, n_rows, p.q);
  p.be.get_rows(DType::f32, p.x, p.n_embd, p.batch.output_rows, n_rows, p.s.x_out.as<float>());
  p.attn = p.q;
  p.x = p.s.x_out.as<float>();
  if (p.lora) {  // the output rows' groups, numbered as the rows now are
    p.s.lora.output_rows.build(p.batch, p.batch.output_rows, n_rows, p.batch.lora_row_at_a_time);
    p.lora = p.s.lora.output_rows.empty() ? nullptr : &p.s.lora.output_rows;
  }
  return n_rows;
}

void gated_feed_forward(ForwardPass& p, int64_t il, int64_t n_rows, GatedUnit unit) {
  const LayerWeights& l = p.w.layers[il];
  const int64_t n_ff = p.c.n_ff;
  const MatmulOut gate_up[] = {l.ffn_gate.into(p.gate), l.ffn_up.into(p.up)};
  p.be.matmul_many(gate_up, 2, p.n_embd, p.xn, n_rows);
  add_lora_of(p, il, {{LoraTarget::gate, p.gate, n_ff}, {LoraTarget::up, p.up, n_ff}}, p.xn, p.n_embd);
  if (unit == GatedUnit::silu) {
    p.be.silu_mul(p.gate, p.up, n_rows * n_ff, p.gate);
  } else {
    p.be.gelu_mul(p.gate, p.up, n_rows * n_ff, p.gate);
  }
  project(p, il, LoraTarget::down, l.ffn_down, p.gate, n_rows, p.xn);
  if (l.post_ffn_norm) p.be.rms_norm(p.xn, l.post_ffn_norm.f32(), n_rows, p.n_embd, p.c.rms_eps, p.xn);
  p.be.add(p.x, p.xn, n_rows * p.n_embd, p.x);
}

void output_head(ForwardPass& p, float* logits) {
  const ModelConfig& c = p.c;
  const ForwardBatch& batch = p.batch;
  const int64_t n_vocab = batch.vocab_rows(c.n_vocab), n_logits = batch.n_outputs * n_vocab;
  float* out = p.s.logits.as<float>();
  p.be.rms_norm(p.x, p.w.output_norm.f32(), batch.n_outputs, c.n_embd, c.rms_eps, p.xn);
  if (p.s.states) {  // an embedding pass: the normed states are its output, no logits
    p.be.download(p.s.xn, 0, logits, sizeof(float) * static_cast<size_t>(batch.n_outputs * c.n_embd));
    return;
  }
  p.be.matmul(p.w.output.type, p.w.output.data, c.n_embd, n_vocab, p.xn, batch.n_outputs, out);
  if (c.final_softcap > 0.0f) p.be.softcap(out, n_logits, c.final_softcap);
  p.be.download(p.s.logits, 0, logits, sizeof(float) * static_cast<size_t>(n_logits));
  if (batch.hidden) {
    p.be.download(p.s.xn, 0, batch.hidden, sizeof(float) * static_cast<size_t>(batch.n_outputs * c.n_embd));
  }
}

}  // namespace ember
