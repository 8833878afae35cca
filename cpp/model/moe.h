// model/moe.h: mixture-of-experts feed-forwards (qwen2moe, qwen3moe, gpt-oss) — their hyper-parameters,
// their scratch, and the routed forward step that reads only the experts a batch's tokens chose.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace ember {

// Reads {arch}.expert_* into `c` for the mixture-of-experts architectures (leaves dense ones
// alone). Throws FormatError for missing or inconsistent counts, Unsupported for routing this
// code does not implement (another gating function, a weight scale, experts in a dense family).
void read_moe_config(const GGUFFile& file, ModelConfig& c);

// The buffers of the routed feed-forward of a micro-batch of up to n_batch rows.
struct MoeScratch {
  int64_t n_rows = 0;   // rows of the per-expert buffers: n_batch, or more for padded calls
  Buffer probs;         // f32 [n_batch, n_expert] router logits, then probabilities
  Buffer x;             // f32 [n_rows, n_embd] the inputs of one expert's tokens
  Buffer gate;          // f32 [n_rows, max(n_ff_exp, n_ff_shexp)] gate, then silu(gate) * up
  Buffer up;            // f32 [n_rows, max(n_ff_exp, n_ff_shexp)]
  Buffer out;           // f32 [n_rows, n_embd] an expert's outputs
  Buffer shared_logit;  // f32 [n_batch] the shared expert's gate logit
  // Host: the routing, rebuilt every layer (sized here, so a step never allocates).
  std::vector<float> host_probs;      // [n_batch * n_expert]
  std::vector<int32_t> choice;        // [n_batch * n_expert_used] experts each row chose
  std::vector<float> choice_weight;   // [n_batch * n_expert_used] and their weights
  std::vector<int32_t> expert_begin;  // [n_expert + 1] offsets into rows / weights, by expert
  std::vector<int32_t> rows;          // [n_batch * n_expert_used] rows grouped by expert, ascending
  std::vector<float> weights;         // [n_batch * n_expert_used] the weight of each of those
  std::vector<int32_t> ids;           // [n_rows] one expert's rows, padded
  std::vector<float> shared_weight;   // [n_batch] sigmoid of the shared gate logit
  std::vector<int32_t> all_rows;      // [n_batch] 0, 1, ..., n_batch - 1

  MoeScratch() = default;
  MoeScratch(Backend& backend, const ModelConfig& c, int64_t n_batch);
};

// x[n_rows, n_embd] += the layer's mixture of experts applied to xn[n_rows, n_embd]: each row's
// top n_expert_used experts by router softmax (renormalised when c.expert_weights_norm), each
// expert run as one matmul over just the rows that chose it (padded to the backend's
// batch-invariant row count, so a row's bits never depend on which rows share its expert), its
// outputs weighted and added back in order of expert index; plus the shared expert, gated by a
// sigmoid, where there is one. gpt-oss's router and experts add their biases (c.expert_bias), its
// experts' activation is the clamped SwiGLU (c.swiglu_limit). The routing is read back to the host (CPU
// backends).
void moe_feed_forward(Backend& be, const ModelConfig& c, const MoeLayerWeights& m, MoeScratch& s,
                      const float* xn, int64_t n_rows, float* x);

}  // namespace ember
