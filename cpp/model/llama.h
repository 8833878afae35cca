// model/llama.h: the forward pass of the llama family (llama, mistral, qwen2, qwen3; see
// ArchInfo for what differs between them).
#pragma once

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

// Runs one micro-batch through the model, appending its keys/values to `kv` at the batch's
// positions, and writes logits [n_outputs, n_vocab] of the batch's output rows (none when
// n_outputs is 0: a prefill chunk). Inputs are validated by the caller (model/context.cpp).
void llama_forward(const Model& model, KVCache& kv, Scratch& scratch, const MicroBatch& batch,
                   float* logits);

}  // namespace ember
