// model/embedder.h: embeddings of whole token sequences from any model — an encoder (bert), or a
// decoder (llama, qwen2, qwen3, gemma...: Qwen3-Embedding, e5-mistral, gte-Qwen2) run causally
// over each whole sequence without its output head. Many sequences are packed into each forward
// pass; their final (normed) token states are pooled as the file says or the options override
// (mean, first token, last token, a reranker's head row, or every token) and optionally
// L2-normalised. One call at a time (concurrent calls wait for each other). Generation goes
// through the engine (engine/); an Embedder of a decoder has its own scratch and cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

struct EmbedderOptions {
  // Token rows per forward pass. An encoder's is raised to its context if smaller (a sequence must
  // fit one pass); a decoder's bounds its inputs' length (max_tokens).
  int64_t n_batch = 2048;
  std::optional<Pooling> pooling;  // overrides the file's {arch}.pooling_type (llama.cpp's --pooling)
};

class Embedder {
 public:
  Embedder(std::shared_ptr<const Model> model, const EmbedderOptions& options = {});

  const Model& model() const { return *model_; }
  int64_t n_embd() const { return model_->config().n_embd; }
  int64_t n_batch() const { return scratch_.n_batch; }
  Pooling pooling() const { return pooling_; }
  // The longest sequence embed() takes: the model's context (an encoder's position table), and a
  // decoder's n_batch (each sequence runs in one pass).
  int64_t max_tokens() const;

  // out[n_out, n_embd] = the pooled final token states of each sequence, divided by their
  // Euclidean norm when `normalize`: one row per sequence (n_out = seqs.size()), or with pooling
  // none one per token, sequences one after another (n_out = their total length). token_types:
  // each sequence's token type ids (segment A 0, segment B 1: a query-document pair), or empty
  // for all 0 (one text). Throws InvalidArgument naming the sequence (and changes nothing) when
  // one is empty, longer than max_tokens(), holds a token id outside the vocabulary, or its
  // token types do not match it or the model's.
  void embed(const std::vector<std::span<const int32_t>>& seqs, bool normalize, float* out,
             const std::vector<std::span<const int32_t>>& token_types = {});
  // The rows of embed()'s out for these sequences (n_out above).
  int64_t n_out_rows(const std::vector<std::span<const int32_t>>& seqs) const;

 private:
  // Runs sequences [first, first + count) (their rows fit one pass) into out rows from out_row_.
  void run_pass(const std::vector<std::span<const int32_t>>& seqs,
                const std::vector<std::span<const int32_t>>& token_types, size_t first, size_t count,
                bool normalize, float* out);

  std::shared_ptr<const Model> model_;
  Pooling pooling_;
  Scratch scratch_;
  Buffer k_cache_;  // f16 [n_layer, n_batch, n_kv_dim]: a pass's keys, row r at slot r
  Buffer v_cache_;  // f16 [n_layer, n_batch, n_kv_dim]
  int64_t kv_row_bytes_ = 0;
  std::vector<int32_t> tokens_;         // [n_batch] the pass's tokens, sequences one after another
  std::vector<int32_t> positions_;      // [n_batch]
  std::vector<int32_t> output_rows_;    // [n_batch] rows whose states pooling reads
  std::vector<SequenceRows> seq_rows_;  // [sequences of the pass]
  std::vector<float> states_;           // [n_batch, n_embd] the output rows' final states
  int64_t out_row_ = 0;                 // the next row of embed()'s out that a pass writes
  std::mutex mutex_;
};

}  // namespace ember
