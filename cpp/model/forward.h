// model/forward.h: the entry point for running batches through a model (what an engine's model
// runner calls): input validation at the edge, then the architecture family's forward pass.
#pragma once

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

// Throws InvalidArgument naming the first problem: token ids outside the vocabulary, more rows
// than the scratch holds, sequences that do not tile the rows in order, positions that are
// negative or not consecutive within a sequence, output rows not strictly ascending.
// O(n_tokens); forward() itself checks nothing.
void validate_batch(const Model& model, const Scratch& scratch, const ForwardBatch& batch);

// Runs `batch`: every row's K/V goes into its sequence's cache at the row's position, and
// logits [n_outputs, n_vocab] of the output rows go to `logits` (may be null when n_outputs
// is 0; it is host memory, the only memory of the pass the host reads). The caches must already
// hold positions 0 .. first position - 1 of each sequence. On a device backend the pass is one
// submission of recorded ops and one wait.
void forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* logits);

}  // namespace ember
