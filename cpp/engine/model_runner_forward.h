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

#include "engine/engine_options.h"
#include "engine/model_runner.h"
#include "kv/paged_kv_cache.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/run_state.h"
#include "sampling/sampler.h"
#include "vision/vision_model.h"

namespace ember {

struct ForwardRunnerConfig {
  int64_t n_blocks = 0;                         // KV blocks: must equal the engine's KVCacheConfig
  int block_size = EngineOptions{}.block_size;  // tokens per block: likewise
  // Tokens one sequence may reach (the scheduler's max_model_len): picks LongRoPE's factors.
  int64_t n_ctx = 0;
  int64_t max_batch_tokens = EngineOptions{}.max_batch_tokens;  // rows of the largest batch (the
                                                                // scratch's n_batch)
  int parallel = EngineOptions{}.parallel;                      // sequences of a batch at most
                                                                // (logit rows)
  DType kv_type = DType::f16;  // the cache's rows: f16, or q8_0 (head_dim % 32 == 0)
  // Every row's result depends only on its token, its position and its sequence's cache, never
  // on the rest of the batch, so batching, chunking, prefix hits and preemption cannot change a
  // request's output. The CPU kernels may give a row different rounding depending on the call's
  // shape (matmul: a kernel for few rows and a GEMM for many, unless the GEMM takes every count;
  // attention: a per-head kernel for one row, a blocked one for several), so the runner runs
  // attention one row at a time and pads every batch, and its outputs, with throwaway rows up
  // to the row count from which the backend's matmul is batch-invariant for every weight type
  // of the model (Backend::matmul_exact_min_rows; no padding where that is 1).
  bool batch_invariant = EngineOptions{}.batch_invariant;
};

class ForwardRunner : public ModelRunner {
 public:
  // Allocates the cache [n_layer, n_blocks * block_size, n_kv_dim] (K and V of kv_type) and the
  // scratch. Throws InvalidArgument for non-positive sizes, Unsupported for a kv_type the
  // model's heads cannot use (PagedKVCache::check_type).
  // `adapters`: the LoRA adapters requests may pick (RequestOptions::lora_adapter indexes them),
  // loaded for this model; their buffers are sized here.
  // `vision`: the projector of the requests' images (RequestOptions::images), on the model's
  // backend; null: the runner takes no images. Its embeddings must be the model's width.
  ForwardRunner(std::shared_ptr<const Model> model, const ForwardRunnerConfig& config,
                std::vector<std::shared_ptr<const LoraAdapter>> adapters = {},
                std::shared_ptr<VisionModel> vision = nullptr);

  std::vector<SampledTokens> execute(const Batch& batch) override;
  void release(std::span<const SequenceId> ids) override;
  void validate(std::span<const int32_t> prompt, const RequestOptions& options) const override;
  // One per (adapter content, scale): a restart that loads the adapters in another order, or
  // another file under the same name, never reads the K/V another adapter wrote.
  uint64_t cache_namespace(const RequestOptions& options) const override;
  void add(RequestId id, const RequestOptions& options) override;
  // Payload layout: per layer, the block's K then its V, each [n_head_kv][block_size][head_bytes]
  // as KVView lays a block out: n_layer * 2 * block_size * row_bytes bytes. A block of one layer
  // is one range of the cache buffer, and so is a run of blocks with consecutive ids (fresh
  // pools hand those out): each run moves with 2 * n_layer transfers, not each block (a device
  // backend waits for every transfer).
  std::vector<std::vector<uint8_t>> read_blocks(std::span<const int32_t> blocks) override;
  void write_blocks(std::span<const BlockLoad> loads) override;
  int64_t block_payload_bytes() const { return cache_.n_layer * 2 * cache_.block_size * cache_.row_bytes; }

  int64_t n_images_encoded() const override { return n_images_encoded_; }
  const Model& model() const { return *model_; }
  const PagedKVCache& cache() const { return cache_; }
  const std::vector<std::shared_ptr<const LoraAdapter>>& adapters() const { return adapters_; }
  int64_t n_samplers() const { return static_cast<int64_t>(samplers_.size()); }

 private:
  // A request's sampler, and how many of its tokens (prompt, then output) it has accepted into
  // its penalty window. Tokens are accepted from the batch's history right before sampling, so
  // a preempted request that recomputes its tokens never feeds them twice.
  struct SequenceSampler {
    Sampler sampler;
    int32_t n_logprobs = -1;
    bool post_sampling = false;  // logprobs after the sampler chain (RequestOptions::post_sampling_probs)
    int64_t n_accepted = 0;
  };

  std::shared_ptr<const Model> model_;
  ForwardRunnerConfig config_;
  PagedKVCache cache_;
  Scratch scratch_;
  std::unordered_map<SequenceId, SequenceSampler> samplers_;
  std::vector<uint8_t> run_bytes_;  // one layer's K (or V) of a run of blocks, in transit
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
  std::vector<const LoraAdapter*> adapter_ptrs_;  // [adapters_] as ForwardBatch takes them
  bool lora_row_at_a_time_ = false;  // batch-invariant, and the f32 matmul's rounding depends on rows
  // Throwaway rows write their K/V here: blocks [n_blocks, n_blocks + n_pad_blocks) of the
  // cache, which the KVCacheManager never hands out.
  std::vector<int32_t> pad_table_;  // [ceil(min_rows_ / block_size)]
  // Batches (and their outputs) are lifted to this many rows: the backend's
  // matmul_exact_min_rows over the model's weight types when batch_invariant, else 1.
  int64_t min_rows_ = 1;
  // Reused every step (no allocation once they reached the largest batch).
  std::vector<int32_t> tokens_, positions_, output_rows_;  // [n_rows (+ padding)]
  std::vector<SequenceRows> rows_;                         // [n_seqs], or [n_rows] one row each
  std::vector<float> logits_;                              // [n_outputs, n_vocab]

  // Images: each encoded once, its embeddings [n_tokens, n_embd] kept by content hash for the
  // kImageCacheSize most recently used (a repeated image, a preempted request's recompute).
  static constexpr size_t kImageCacheSize = 16;
  const std::vector<float>& image_embeddings(const RequestImage& image);
  std::shared_ptr<VisionModel> vision_;
  std::vector<std::pair<uint64_t, std::vector<float>>> image_cache_;  // most recent last
  int64_t n_images_encoded_ = 0;
  std::vector<float> embd_;          // [rows given as embeddings, n_embd] this step
  std::vector<int32_t> embd_rows_;   // [rows given as embeddings]
  std::vector<int32_t> key_bounds_;  // [n_rows (+ padding)] when the images attend both ways
};

}  // namespace ember
