// model/forward.cpp: batch validation, and dispatch to the architecture family's forward pass.
#include "model/forward.h"

#include "core/error.h"
#include "model/bert.h"
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
    // An encoder attends both ways: each sequence whole, in one pass, within its positions.
    const int64_t last = b.positions[s.row_begin + s.n_rows - 1];
    if (model.config().is_encoder() &&
        (b.positions[s.row_begin] != 0 || last >= model.config().n_ctx_train)) {
      throw InvalidArgument(cat("[model] sequence ", is, " has positions ", b.positions[s.row_begin], "..",
                                last,
                                "; an encoder's sequence must be whole, from position 0, and shorter than ",
                                model.config().n_ctx_train, " tokens"));
    }
    if (s.lora < -1 || s.lora >= b.n_adapters) {
      throw InvalidArgument(
          cat("[model] sequence ", is, " names LoRA adapter ", s.lora, " of ", b.n_adapters));
    }
    next_row += s.n_rows;
  }
  for (int64_t i = 0; i < b.n_adapters; ++i) {
    if (b.adapters[i]->max_rank() > scratch.lora.max_rank) {
      throw InvalidArgument(cat("[model] LoRA adapter ", b.adapters[i]->path(), " has rank ",
                                b.adapters[i]->max_rank(), "; the scratch was sized for ",
                                scratch.lora.max_rank));
    }
  }
  if (next_row != b.n_tokens) {
    throw InvalidArgument(
        cat("[model] the sequences cover ", next_row, " of the batch's ", b.n_tokens, " rows"));
  }
  if (b.n_vocab_rows != 0 && !valid_vocab_rows(b.n_vocab_rows, n_vocab)) {
    throw InvalidArgument(cat("[model] logits of ", b.n_vocab_rows, " tokens asked for; the vocabulary has ",
                              n_vocab, ", and a part of it must be a multiple of ", kVocabRowsAlign));
  }
  if (const RowEmbeddings* e = b.embeddings) {
    if (model.config().is_encoder() || e->n_rows > b.n_tokens) {
      throw InvalidArgument(cat("[model] ", e->n_rows, " rows given as embeddings in a batch of ", b.n_tokens,
                                " rows", model.config().is_encoder() ? " of an encoder" : ""));
    }
    for (int64_t i = 0; i < e->n_rows; ++i) {
      if (e->rows[i] < 0 || e->rows[i] >= b.n_tokens || (i > 0 && e->rows[i] <= e->rows[i - 1])) {
        throw InvalidArgument(cat("[model] rows given as embeddings must be strictly ascending rows below ",
                                  b.n_tokens, "; embedding ", i, " is row ", e->rows[i]));
      }
    }
  }
  // A bound past a row's own position names keys later rows of the batch write (the runner may
  // split one sequence into one-row sequences over the same cache: batch invariance).
  if (b.key_bounds) {
    for (int64_t r = 0; r < b.n_tokens; ++r) {
      if (b.key_bounds[r] < b.positions[r] || b.key_bounds[r] - b.positions[r] > b.n_tokens - 1 - r) {
        throw InvalidArgument(cat("[model] row ", r, " at position ", b.positions[r],
                                  " attends up to position ", b.key_bounds[r],
                                  ", past the rows the batch writes"));
      }
    }
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
    case ArchFamily::bert: bert_forward(model, scratch, batch, logits); break;
  }
  // A device backend ran the pass as one submission (the logits' download); a pass without
  // outputs (a prompt chunk) is submitted here, so every step ends with its work done.
  model.backend().synchronize();
}

void forward_rows(const Model& model, Scratch& scratch, std::span<const int32_t> tokens,
                  std::span<const int32_t> positions, std::span<const SequenceRows> seqs,
                  int64_t kv_layer_stride, std::span<const int32_t> output_rows, std::vector<float>& out,
                  int64_t n_vocab_rows, std::vector<float>* hidden,
                  std::span<const LoraAdapter* const> adapters, bool lora_row_at_a_time,
                  const RowEmbeddings* embeddings, const int32_t* key_bounds) {
  if (positions.size() != tokens.size()) {
    throw InvalidArgument(
        cat("[model] a batch has ", tokens.size(), " tokens and ", positions.size(), " positions"));
  }
  ForwardBatch batch;
  batch.tokens = tokens.data();
  batch.positions = positions.data();
  batch.n_tokens = static_cast<int64_t>(tokens.size());
  batch.seqs = seqs.data();
  batch.n_seqs = static_cast<int64_t>(seqs.size());
  batch.kv_layer_stride = kv_layer_stride;
  batch.output_rows = output_rows.data();
  batch.n_outputs = static_cast<int64_t>(output_rows.size());
  batch.n_vocab_rows = n_vocab_rows;
  batch.adapters = adapters.data();
  batch.n_adapters = static_cast<int64_t>(adapters.size());
  batch.lora_row_at_a_time = lora_row_at_a_time;
  batch.embeddings = embeddings;
  batch.key_bounds = key_bounds;
  validate_batch(model, scratch, batch);
  const ModelConfig& c = model.config();
  if (hidden) {
    hidden->resize(static_cast<size_t>(batch.n_outputs * c.n_embd));
    batch.hidden = hidden->data();
  }
  out.resize(
      static_cast<size_t>(batch.n_outputs * (scratch.states ? c.n_embd : batch.vocab_rows(c.n_vocab))));
  forward(model, scratch, batch, out.data());
}

}  // namespace ember
