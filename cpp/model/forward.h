// model/forward.h: the entry point for running batches through a model (what an engine's model
// runner calls): input validation at the edge, then the architecture family's forward pass.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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
// is 0; it is host memory, the only memory of the pass the host reads). With a states scratch
// (Scratch::states: an embedder's, an encoder's) the final token states [n_outputs, n_embd] go
// there instead of logits. The caches must already hold positions 0 .. first position - 1 of
// each sequence. On a device backend the pass is one submission of recorded ops and one wait.
void forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* logits);

// What every caller of a batched pass does: lays its rows out as a ForwardBatch — tokens and
// positions [n_rows], seqs covering the rows in order with K/V layers kv_layer_stride bytes
// apart, ascending output_rows [n_outputs] — validates it (validate_batch), sizes `out` to
// [n_outputs, n_vocab] (a states scratch: [n_outputs, n_embd]) and runs forward() into it. With
// n_vocab_rows, logits of that many leading tokens only ([n_outputs, n_vocab_rows]); with
// `hidden`, sized to [n_outputs, n_embd], the final states too; with `adapters`, the LoRA
// adapters the seqs name (ForwardBatch's fields); with `embeddings` and `key_bounds`, rows given
// as embeddings and each row's last key (ForwardBatch's fields).
void forward_rows(const Model& model, Scratch& scratch, std::span<const int32_t> tokens,
                  std::span<const int32_t> positions, std::span<const SequenceRows> seqs,
                  int64_t kv_layer_stride, std::span<const int32_t> output_rows, std::vector<float>& out,
                  int64_t n_vocab_rows = 0, std::vector<float>* hidden = nullptr,
                  std::span<const LoraAdapter* const> adapters = {}, bool lora_row_at_a_time = false,
                  const RowEmbeddings* embeddings = nullptr, const int32_t* key_bounds = nullptr);

}  // namespace ember
