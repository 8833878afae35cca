// model/llama.cpp: the llama-family decoder — pre-norm blocks of grouped-query attention with
// RoPE and a SwiGLU feed-forward (or a mixture of SwiGLU experts: model/moe.h). Reads top to
// bottom; every op goes through the Backend.
#include "model/llama.h"

#include "model/blocks.h"
#include "model/moe.h"

namespace ember {

void llama_forward(const Model& model, Scratch& s, const ForwardBatch& batch, float* logits) {
  ForwardPass p(model, s, batch);
  const ModelConfig& c = p.c;
  const RopeParams rope = model.rope_params(0, s.long_rope);

  p.be.get_rows(p.w.token_embd.type, p.w.token_embd.data, p.n_embd, batch.tokens, p.n, p.x);
  place_embeddings(p);  // image tokens (a vision model's): the projector's output

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = p.w.layers[il];
    // --- attention: x += wo · attention(rope(q), rope(k), v), h = norm(x), with the biases and
    // Q/K norms of the architectures that have them (Mistral: every layer windowed) ---
    const int64_t n_rows = decoder_attention(p, il, rope);
    if (n_rows == 0) break;  // the last layer of a chunk that wants no logits: its cache only

    // --- feed-forward: down(silu(gate(h)) * up(h)), h = norm(x) ---
    p.be.rms_norm(p.x, l.ffn_norm.f32(), n_rows, p.n_embd, c.rms_eps, p.xn);
    if (l.moe) {  // a mixture of experts adds its output to x itself
      moe_feed_forward(p.be, c, l.moe, s.moe, p.xn, n_rows, p.x);
      continue;
    }
    gated_feed_forward(p, il, n_rows, GatedUnit::silu);
  }
  if (batch.n_outputs == 0) return;

  output_head(p, logits);  // x now holds exactly the output rows, in order
}

}  // namespace ember
