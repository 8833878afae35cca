// model/llama.h: the forward pass of the llama family (llama, mistral, qwen2, qwen3; see
// ArchInfo for what differs between them).
#pragma once

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

// Runs a batch through the model, writing every row's key/value into its sequence's cache at
// the row's position, and writes logits [n_outputs, n_vocab] of the batch's output rows (none
// when n_outputs is 0: prefill chunks). Inputs are validated by the caller (validate_batch).
void llama_forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* logits);

}  // namespace ember
