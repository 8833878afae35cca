// model/embedder.h: embeddings of whole token sequences from an encoder model (bert) — many
// sequences packed into each forward pass, their token states pooled as the model's file says
// (mean, CLS or last token) and optionally L2-normalised. One call at a time (concurrent calls
// wait for each other). Generation models go through the engine instead (engine/).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

struct EmbedderOptions {
  int64_t n_batch = 2048;  // token rows per forward pass; raised to the model's context if smaller
};

class Embedder {
 public:
  // Throws InvalidArgument when the model is not an encoder.
  Embedder(std::shared_ptr<const Model> model, const EmbedderOptions& options = {});

  const Model& model() const { return *model_; }
  int64_t n_embd() const { return model_->config().n_embd; }
  int64_t n_batch() const { return scratch_.n_batch; }
  // The longest sequence embed() takes (the model's position table).
  int64_t max_tokens() const { return model_->config().n_ctx_train; }

  // out[seqs.size(), n_embd] = the pooled final token states of each sequence, divided by their
  // Euclidean norm when `normalize`. token_types: each sequence's token type ids (segment A 0,
  // segment B 1: a query-document pair), or empty for all 0 (one text). Throws InvalidArgument
  // naming the sequence (and changes nothing) when one is empty, longer than max_tokens(), holds
  // a token id outside the vocabulary, or its token types do not match it or the model's.
  void embed(const std::vector<std::span<const int32_t>>& seqs, bool normalize, float* out,
             const std::vector<std::span<const int32_t>>& token_types = {});

 private:
  // Runs sequences [first, first + count) (their rows fit one pass) into out rows from first.
  void run_pass(const std::vector<std::span<const int32_t>>& seqs,
                const std::vector<std::span<const int32_t>>& token_types, size_t first, size_t count,
                bool normalize, float* out);

  std::shared_ptr<const Model> model_;
  Scratch scratch_;
  Buffer k_cache_;  // f16 [n_layer, n_batch, n_kv_dim]: a pass's keys, row r at slot r
  Buffer v_cache_;  // f16 [n_layer, n_batch, n_kv_dim]
  int64_t kv_row_bytes_ = 0;
  std::vector<int32_t> tokens_;         // [n_batch] the pass's tokens, sequences one after another
  std::vector<int32_t> positions_;      // [n_batch]
  std::vector<int32_t> output_rows_;    // [n_batch] rows whose states pooling reads
  std::vector<SequenceRows> seq_rows_;  // [sequences of the pass]
  std::vector<float> states_;           // [n_batch, n_embd] the output rows' final states
  std::mutex mutex_;
};

}  // namespace ember
