// model/bert.h: the BERT encoder's forward pass (see bert.cpp).
#pragma once

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

// Runs `batch`, whose sequences are each complete (positions 0 .. n_rows - 1: attention is
// bidirectional, so a sequence cannot be split across passes), and writes the final token states
// of the output rows to states[n_outputs, n_embd]. Their K/V go through the sequences' caches.
void bert_forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* states);

}  // namespace ember
