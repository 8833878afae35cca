// model/context.h: one sequence evaluated for its logits (ember.Model.eval) — the same forward
// pass and the same paged KV cache as the engine, with the sequence owning every block in order.
// Generation never runs here: it runs on the engine (engine/). Evaluation splits long inputs into
// micro-batches of n_batch rows. One evaluation at a time (concurrent calls wait for each other).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "model/run_state.h"

namespace ember {

struct ContextOptions {
  int64_t n_ctx = 0;      // tokens the cache holds; <= 0: min(n_ctx_train, kDefaultMaxCtx)
  int64_t n_batch = 512;  // rows per forward pass (bounds the scratch memory)
};

class Context {
 public:
  static constexpr int64_t kDefaultMaxCtx = 4096;

  Context(std::shared_ptr<const Model> model, const ContextOptions& options = {});

  const Model& model() const { return *model_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_batch() const { return scratch_.n_batch; }
  int64_t n_past() const { return n_past_; }  // tokens in the cache

  // Forgets every cached token.
  void reset() { n_past_ = 0; }

  // Appends tokens[n_tokens] to the sequence (positions n_past() ...) and writes the logits of
  // the rows listed in output_rows (strictly ascending indexes into tokens) to
  // logits[n_outputs, n_vocab]. Throws InvalidArgument (and changes nothing) when a token id
  // is out of range, the rows are not ascending, or the cache would overflow.
  void eval(const int32_t* tokens, int64_t n_tokens, const int32_t* output_rows, int64_t n_outputs,
            float* logits);
  // The two common cases: logits of every row [n_tokens, n_vocab], or of the last row only.
  void eval_all(const int32_t* tokens, int64_t n_tokens, float* logits);
  void eval_last(const int32_t* tokens, int64_t n_tokens, float* logits);

 private:
  static constexpr int64_t kBlockSize = 16;

  std::shared_ptr<const Model> model_;
  int64_t n_ctx_ = 0;
  PagedKVCache kv_;                   // f16, ceil(n_ctx / kBlockSize) blocks
  std::vector<int32_t> block_table_;  // [n_blocks] 0, 1, 2, ...: the sequence owns them all
  Scratch scratch_;
  int64_t n_past_ = 0;
  std::vector<int32_t> all_rows_;  // [n_batch] 0, 1, 2, ... for eval_all
  // Host tables of the chunk being run (ops read them as host memory, see backend.h).
  std::vector<int32_t> positions_;      // [n_batch] position of each row
  std::vector<int32_t> chunk_outputs_;  // [n_batch] rows of the chunk whose logits are wanted
  std::mutex mutex_;
};

}  // namespace ember
