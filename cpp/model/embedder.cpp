// model/embedder.cpp: packing sequences into forward passes, and pooling their token states.
#include "model/embedder.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/forward.h"

namespace ember {

Embedder::Embedder(std::shared_ptr<const Model> model, const EmbedderOptions& options)
    : model_(std::move(model)), pooling_(options.pooling.value_or(model_->config().pooling)) {
  const ModelConfig& c = model_->config();
  if (options.n_batch <= 0) throw InvalidArgument(cat("[embed] n_batch must be > 0, got ", options.n_batch));
  const int64_t n_batch = c.is_encoder() ? std::max(options.n_batch, c.n_ctx_train) : options.n_batch;
  scratch_ = Scratch(model_->backend(), c, n_batch, /*states=*/true);
  scratch_.long_rope = model_->uses_long_rope(max_tokens());
  kv_row_bytes_ = c.n_kv_dim() * int64_t{sizeof(uint16_t)};
  const size_t cache_bytes = static_cast<size_t>(c.n_layer * n_batch * kv_row_bytes_);
  k_cache_ = model_->backend().alloc(cache_bytes);
  v_cache_ = model_->backend().alloc(cache_bytes);
  tokens_.resize(n_batch);
  positions_.resize(n_batch);
  output_rows_.resize(n_batch);
  states_.resize(static_cast<size_t>(n_batch * c.n_embd));
}

int64_t Embedder::max_tokens() const {
  const int64_t n_ctx = model_->config().n_ctx_train;
  return n_ctx > 0 ? std::min(n_ctx, n_batch()) : n_batch();
}

int64_t Embedder::n_out_rows(const std::vector<std::span<const int32_t>>& seqs) const {
  if (pooling_ != Pooling::none) return static_cast<int64_t>(seqs.size());
  int64_t n = 0;
  for (const auto& seq : seqs) n += static_cast<int64_t>(seq.size());
  return n;
}

void Embedder::embed(const std::vector<std::span<const int32_t>>& seqs, bool normalize, float* out,
                     const std::vector<std::span<const int32_t>>& token_types) {
  const int64_t n_vocab = model_->config().n_vocab;
  const int64_t n_types = std::max<int64_t>(model_->config().n_token_types, 1);
  if (!token_types.empty() && token_types.size() != seqs.size()) {
    throw InvalidArgument(
        cat("[embed] ", token_types.size(), " token type lists for ", seqs.size(), " inputs"));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(seqs[i].size());
    if (n == 0 || n > max_tokens()) {
      throw InvalidArgument(cat("[embed] input ", i, " has ", n, " tokens; expected 1 to ", max_tokens(),
                                " (the most one forward pass of this model takes)"));
    }
    for (int64_t t = 0; t < n; ++t) {
      if (seqs[i][t] < 0 || seqs[i][t] >= n_vocab) {
        throw InvalidArgument(cat("[embed] input ", i, " token ", t, " has id ", seqs[i][t],
                                  ", outside the vocabulary [0, ", n_vocab, ")"));
      }
    }
    if (token_types.empty()) continue;
    if (token_types[i].size() != seqs[i].size()) {
      throw InvalidArgument(
          cat("[embed] input ", i, " has ", n, " tokens but ", token_types[i].size(), " token types"));
    }
    for (int64_t t = 0; t < n; ++t) {
      if (token_types[i][t] < 0 || token_types[i][t] >= n_types) {
        throw InvalidArgument(cat("[embed] input ", i, " token ", t, " has token type ", token_types[i][t],
                                  "; the model has ", n_types));
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  out_row_ = 0;
  size_t first = 0;
  while (first < seqs.size()) {
    size_t count = 0;
    int64_t rows = 0;
    while (first + count < seqs.size() &&
           rows + static_cast<int64_t>(seqs[first + count].size()) <= n_batch()) {
      rows += static_cast<int64_t>(seqs[first + count].size());
      ++count;
    }
    run_pass(seqs, token_types, first, count, normalize, out);
    first += count;
  }
}

void Embedder::run_pass(const std::vector<std::span<const int32_t>>& seqs,
                        const std::vector<std::span<const int32_t>>& token_types, size_t first, size_t count,
                        bool normalize, float* out) {
  const ModelConfig& c = model_->config();
  const int64_t n_embd = c.n_embd;
  seq_rows_.clear();
  int64_t n_rows = 0, n_outputs = 0;
  for (size_t i = first; i < first + count; ++i) {
    const int64_t n = static_cast<int64_t>(seqs[i].size());
    SequenceRows s;
    s.row_begin = n_rows;
    s.n_rows = n;
    // A contiguous cache: the sequence's rows are one block of n slots from row row_begin on.
    s.kv.type = DType::f16;
    s.kv.k = k_cache_.as<uint8_t>() + n_rows * kv_row_bytes_;
    s.kv.v = v_cache_.as<uint8_t>() + n_rows * kv_row_bytes_;
    s.kv.n_head_kv = c.n_head_kv;
    s.kv.head_bytes = kv_row_bytes_ / s.kv.n_head_kv;
    s.kv.block_size = std::max<int64_t>(n, 1);
    seq_rows_.push_back(s);
    for (int64_t t = 0; t < n; ++t) {
      tokens_[n_rows + t] = seqs[i][t];
      positions_[n_rows + t] = static_cast<int32_t>(t);
      if (c.is_encoder()) scratch_.token_types[n_rows + t] = token_types.empty() ? 0 : token_types[i][t];
    }
    // The rows pooling reads: a reranker's head reads the first token's state in an encoder (its
    // [CLS]) and the last one's in a decoder (the only one that saw the whole sequence).
    const bool first_row = pooling_ == Pooling::cls || (pooling_ == Pooling::rank && c.is_encoder());
    const bool last_row = pooling_ == Pooling::last || (pooling_ == Pooling::rank && !c.is_encoder());
    if (first_row) {
      output_rows_[n_outputs++] = static_cast<int32_t>(n_rows);
    } else if (last_row) {
      output_rows_[n_outputs++] = static_cast<int32_t>(n_rows + n - 1);
    } else {  // mean, none
      for (int64_t t = 0; t < n; ++t) output_rows_[n_outputs++] = static_cast<int32_t>(n_rows + t);
    }
    n_rows += n;
  }
  forward_rows(*model_, scratch_, std::span(tokens_).first(n_rows), std::span(positions_).first(n_rows),
               seq_rows_, n_batch() * kv_row_bytes_, std::span(output_rows_).first(n_outputs), states_);

  // Pooling in f32 over the output rows: each sequence's rows (mean), or its one row; pooling none
  // copies every row (out's rows then count tokens: those of earlier passes come first).
  int64_t state_row = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t n_pooled = pooling_ == Pooling::mean ? seq_rows_[i].n_rows : 1;
    const int64_t n_vectors = pooling_ == Pooling::none ? seq_rows_[i].n_rows : 1;
    for (int64_t v = 0; v < n_vectors; ++v) {
      float* e = out + (out_row_ + v) * n_embd;
      std::fill(e, e + n_embd, 0.0f);
      for (int64_t r = 0; r < n_pooled; ++r, ++state_row) {
        const float* st = states_.data() + state_row * n_embd;
        for (int64_t d = 0; d < n_embd; ++d) e[d] += st[d];
      }
      const float inv_n = 1.0f / static_cast<float>(n_pooled);
      for (int64_t d = 0; d < n_embd; ++d) e[d] *= inv_n;
      if (normalize) {
        double sum_sq = 0.0;
        for (int64_t d = 0; d < n_embd; ++d) sum_sq += double{e[d]} * e[d];
        // A zero vector stays zero (as sentence-transformers' normalize, which clamps the norm).
        const float inv_norm = sum_sq > 0.0 ? static_cast<float>(1.0 / std::sqrt(sum_sq)) : 0.0f;
        for (int64_t d = 0; d < n_embd; ++d) e[d] *= inv_norm;
      }
    }
    out_row_ += n_vectors;
  }
}

}  // namespace ember
