// engine/model_runner_forward.h: the real ModelRunner — a loaded model's batched forward pass
// over the paged KV cache, then one sampler per request. Owns the cache memory, the activation
// scratch and the samplers; the KVCacheManager (in the engine) decides which slots are whose.
// Runs on the engine thread only, except validate() (any thread, reads immutable state).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "model/run_state.h"
#include "sampling/sampler.h"

namespace ember {

struct ForwardRunnerConfig {
  int64_t n_blocks = 0;                  // KV blocks: must equal the engine's KVCacheConfig
  int block_size = 16;                   // tokens per block: likewise
  int64_t max_num_batched_tokens = 512;  // rows of the largest batch (the scratch's n_batch)
  int max_num_seqs = 16;                 // sequences of a batch at most (logit rows)
};

class ForwardRunner : public ModelRunner {
 public:
  // Allocates the cache [n_layer, n_blocks * block_size, n_kv_dim] (f16 K and V) and the
  // scratch. Throws InvalidArgument for non-positive sizes.
  ForwardRunner(std::shared_ptr<const Model> model, const ForwardRunnerConfig& config);

  std::vector<int32_t> execute(const Batch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  void validate(std::span<const int32_t> prompt, const RequestOptions& options) const override;
  void add(RequestId id, const RequestOptions& options) override;
  std::span<const std::optional<TokenLogprobs>> last_logprobs() const override { return logprobs_; }

  const Model& model() const { return *model_; }
  const PagedKVCache& cache() const { return cache_; }
  int64_t n_samplers() const { return static_cast<int64_t>(samplers_.size()); }

 private:
  // A request's sampler, and how many of its tokens (prompt, then output) it has accepted into
  // its penalty window. Tokens are accepted from the batch's history right before sampling, so
  // a preempted request that recomputes its tokens never feeds them twice.
  struct SequenceSampler {
    Sampler sampler;
    int32_t n_logprobs = -1;
    int64_t n_accepted = 0;
  };

  std::shared_ptr<const Model> model_;
  ForwardRunnerConfig config_;
  PagedKVCache cache_;
  Scratch scratch_;
  std::unordered_map<SequenceId, SequenceSampler> samplers_;
  // Reused every step (no allocation once they reached the largest batch).
  std::vector<SequenceRows> rows_;                       // [n_seqs]
  std::vector<float> logits_;                            // [n_outputs, n_vocab]
  std::vector<std::optional<TokenLogprobs>> logprobs_;   // [n_outputs] of the last step
};

}  // namespace ember
