// model/context.cpp: input validation and micro-batching around the architecture's forward.
#include "model/context.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/forward.h"

namespace ember {

namespace {

int64_t choose_n_ctx(const ModelConfig& config, int64_t requested) {
  if (requested > 0) return requested;
  return std::min(config.n_ctx_train, Context::kDefaultMaxCtx);
}

}  // namespace

Context::Context(std::shared_ptr<const Model> model, const ContextOptions& options)
    : model_(std::move(model)) {
  const ModelConfig& c = model_->config();
  if (c.is_encoder()) {
    throw InvalidArgument(cat("[model] ", model_->file().path(), ": '", c.arch->name,
                              "' is an embedding model; it has no logits (embed with it instead)"));
  }
  if (options.n_batch <= 0) {
    throw InvalidArgument(cat("[model] n_batch must be > 0, got ", options.n_batch));
  }
  n_ctx_ = choose_n_ctx(c, options.n_ctx);
  const int64_t n_blocks = (n_ctx_ + kBlockSize - 1) / kBlockSize;
  kv_ = PagedKVCache(model_->backend(), c.n_layer, c.n_head_kv, c.head_dim, n_blocks, kBlockSize, DType::f16);
  block_table_.resize(n_blocks);
  std::iota(block_table_.begin(), block_table_.end(), 0);
  scratch_ = Scratch(model_->backend(), c, std::min(options.n_batch, n_ctx_));
  scratch_.long_rope = model_->uses_long_rope(n_ctx_);
  all_rows_.resize(scratch_.n_batch);
  positions_.resize(scratch_.n_batch);
  chunk_outputs_.resize(scratch_.n_batch);
  std::iota(all_rows_.begin(), all_rows_.end(), 0);
}

void Context::eval(const int32_t* tokens, int64_t n_tokens, const int32_t* output_rows, int64_t n_outputs,
                   float* logits) {
  std::lock_guard<std::mutex> lock(mutex_);
  const ModelConfig& c = model_->config();
  if (n_tokens <= 0) throw InvalidArgument("[model] eval needs at least one token");
  if (n_past_ + n_tokens > n_ctx()) {
    throw InvalidArgument(cat("[model] ", n_past_ + n_tokens, " tokens (", n_past_, " cached + ", n_tokens,
                              " new) exceed the context size n_ctx = ", n_ctx()));
  }
  for (int64_t i = 0; i < n_tokens; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) {
      throw InvalidArgument(
          cat("[model] token ", i, " has id ", tokens[i], ", outside the vocabulary [0, ", c.n_vocab, ")"));
    }
  }
  for (int64_t i = 0; i < n_outputs; ++i) {
    if (output_rows[i] < 0 || output_rows[i] >= n_tokens || (i > 0 && output_rows[i] <= output_rows[i - 1])) {
      throw InvalidArgument(cat("[model] output rows must be strictly ascending indexes below ", n_tokens,
                                "; row ", i, " is ", output_rows[i]));
    }
  }

  int32_t* positions = positions_.data();
  int32_t* chunk_outputs = chunk_outputs_.data();
  int64_t next_output = 0;  // first of output_rows not yet computed
  for (int64_t begin = 0; begin < n_tokens; begin += scratch_.n_batch) {
    const int64_t n = std::min(scratch_.n_batch, n_tokens - begin);
    for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(n_past_ + i);
    int64_t n_chunk_outputs = 0;
    while (next_output + n_chunk_outputs < n_outputs &&
           output_rows[next_output + n_chunk_outputs] < begin + n) {
      chunk_outputs[n_chunk_outputs] = static_cast<int32_t>(output_rows[next_output + n_chunk_outputs] -
                                                            begin);
      ++n_chunk_outputs;
    }
    SequenceRows seq;
    seq.n_rows = n;
    seq.kv = kv_.layer(0, block_table_.data());
    ForwardBatch batch;
    batch.tokens = tokens + begin;
    batch.positions = positions;
    batch.n_tokens = n;
    batch.seqs = &seq;
    batch.n_seqs = 1;
    batch.kv_layer_stride = kv_.layer_bytes();
    batch.output_rows = chunk_outputs;
    batch.n_outputs = n_chunk_outputs;
    forward(*model_, scratch_, batch, logits + next_output * c.n_vocab);
    next_output += n_chunk_outputs;
    n_past_ += n;
  }
}

void Context::eval_all(const int32_t* tokens, int64_t n_tokens, float* logits) {
  // The precomputed table covers inputs up to n_batch rows (every decode step); a longer
  // input is a prefill, where one small allocation does not matter.
  if (n_tokens <= scratch_.n_batch) {
    eval(tokens, n_tokens, all_rows_.data(), n_tokens, logits);
    return;
  }
  std::vector<int32_t> rows(n_tokens);
  std::iota(rows.begin(), rows.end(), 0);
  eval(tokens, n_tokens, rows.data(), n_tokens, logits);
}

void Context::eval_last(const int32_t* tokens, int64_t n_tokens, float* logits) {
  const int32_t last = static_cast<int32_t>(n_tokens - 1);
  eval(tokens, n_tokens, &last, n_tokens > 0 ? 1 : 0, logits);
}

}  // namespace ember
