// model/forward.cpp: batch validation, and dispatch to the architecture family's forward pass.
#include "model/forward.h"

#include "core/error.h"
#include "model/gemma3.h"
#include "model/llama.h"

namespace ember {

void validate_batch(const Model& model, const Scratch& scratch, const ForwardBatch& b) {
  const int64_t n_vocab = model.config().n_vocab;
  if (b.n_tokens < 1 || b.n_tokens > scratch.n_batch) {
    throw InvalidArgument(cat("[model] a batch has ", b.n_tokens, " rows; expected 1 to ", scratch.n_batch,
                              " (the scratch's n_batch)"));
  }
  for (int64_t r = 0; r < b.n_tokens; ++r) {
    if (b.tokens[r] < 0 || b.tokens[r] >= n_vocab) {
      throw InvalidArgument(
          cat("[model] token ", r, " has id ", b.tokens[r], ", outside the vocabulary [0, ", n_vocab, ")"));
    }
  }
  int64_t next_row = 0;
  for (int64_t is = 0; is < b.n_seqs; ++is) {
    const SequenceRows& s = b.seqs[is];
    if (s.row_begin != next_row || s.n_rows < 1) {
      throw InvalidArgument(cat("[model] sequence ", is, " covers rows [", s.row_begin, ", ",
                                s.row_begin + s.n_rows, "); expected to start at row ", next_row,
                                " with at least one row"));
    }
    for (int64_t r = s.row_begin; r < s.row_begin + s.n_rows; ++r) {
      const bool consecutive = r == s.row_begin ? b.positions[r] >= 0
                                                : b.positions[r] == b.positions[r - 1] + 1;
      if (!consecutive) {
        throw InvalidArgument(cat("[model] row ", r, " of sequence ", is, " has position ", b.positions[r],
                                  "; positions of a sequence must be consecutive from >= 0"));
      }
    }
    next_row += s.n_rows;
  }
  if (next_row != b.n_tokens) {
    throw InvalidArgument(
        cat("[model] the sequences cover ", next_row, " of the batch's ", b.n_tokens, " rows"));
  }
  for (int64_t i = 0; i < b.n_outputs; ++i) {
    const int32_t row = b.output_rows[i];
    if (row < 0 || row >= b.n_tokens || (i > 0 && row <= b.output_rows[i - 1])) {
      throw InvalidArgument(cat("[model] output rows must be strictly ascending rows below ", b.n_tokens,
                                "; output ", i, " is row ", row));
    }
  }
}

void forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* logits) {
  switch (model.config().arch->family) {
    case ArchFamily::llama: llama_forward(model, scratch, batch, logits); break;
    case ArchFamily::gemma3: gemma3_forward(model, scratch, batch, logits); break;
  }
  // A device backend ran the pass as one submission (the logits' download); a pass without
  // outputs (a prompt chunk) is submitted here, so every step ends with its work done.
  model.backend().synchronize();
}

}  // namespace ember
