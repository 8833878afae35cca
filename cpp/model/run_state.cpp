// model/run_state.cpp: sizing of the scratch buffers.
#include "model/run_state.h"

#include <algorithm>

namespace ember {

Scratch::Scratch(Backend& backend, const ModelConfig& c, int64_t n_batch_, bool states_)
    : n_batch(n_batch_), states(states_ || c.is_encoder()) {
  auto floats = [&](int64_t n_cols) { return backend.alloc(sizeof(float) * n_batch * n_cols); };
  x = floats(c.n_embd);
  xn = floats(c.n_embd);
  x_out = floats(c.n_embd);
  q = floats(c.n_q_dim());
  k = floats(c.n_kv_dim());
  v = floats(c.n_kv_dim());
  attn = floats(c.n_q_dim());
  ffn_gate = floats(c.n_ff);
  ffn_up = floats(c.n_ff);
  // CPU: committed only as far as written.
  logits = floats(states ? c.n_embd : c.n_vocab);
  if (c.is_moe()) moe = MoeScratch(backend, c, n_batch);
  row_ids.resize(n_batch);
  for (int64_t i = 0; i < n_batch; ++i) row_ids[i] = static_cast<int32_t>(i);
  if (c.is_encoder()) {
    token_types.assign(n_batch, 0);
    key_bounds.resize(n_batch);
  }
  // Every matmul of a forward pass has at most n_batch rows and one of these widths as n_in.
  backend.reserve_matmul(n_batch, std::max({c.n_embd, c.n_q_dim(), c.n_ff}));
}

}  // namespace ember
