// model/gemma3.cpp: the Gemma 3 and Gemma 2 decoder — sandwich-normed blocks of grouped-query
// attention (Q/K norms in Gemma 3, soft-capped scores in Gemma 2, RoPE, local sliding-window
// layers between global ones) and a GeGLU feed-forward; Gemma 2 soft-caps the logits too.
// Reads top to bottom; every op goes through the Backend.
#include "model/gemma3.h"

#include <cmath>

#include "model/blocks.h"

namespace ember {

void gemma3_forward(const Model& model, Scratch& s, const ForwardBatch& batch, float* logits) {
  ForwardPass p(model, s, batch);
  const ModelConfig& c = p.c;

  p.be.get_rows(p.w.token_embd.type, p.w.token_embd.data, p.n_embd, batch.tokens, p.n, p.x);
  p.be.scale(p.x, p.n * p.n_embd, std::sqrt(static_cast<float>(p.n_embd)));
  place_embeddings(p);  // image tokens: the projector's output, unscaled (as transformers)

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = p.w.layers[il];
    // --- attention: x += post_norm(wo · attention(rope(norm(q)), rope(norm(k)), v)), the Q/K
    // norms Gemma 3's only; local layers rotate on their own base ---
    const int64_t n_rows = decoder_attention(p, il, model.rope_params(il, s.long_rope));
    if (n_rows == 0) break;  // the last layer of a chunk that wants no logits: its cache only

    // --- feed-forward: x += post_norm(down(gelu(gate(h)) * up(h))), h = norm(x) ---
    p.be.rms_norm(p.x, l.ffn_norm.f32(), n_rows, p.n_embd, c.rms_eps, p.xn);
    gated_feed_forward(p, il, n_rows, GatedUnit::gelu);
  }
  if (batch.n_outputs == 0) return;

  output_head(p, logits);  // x now holds exactly the output rows, in order
}

}  // namespace ember
