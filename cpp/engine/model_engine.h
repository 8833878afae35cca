// engine/model_engine.h: an Engine serving a loaded model — sizes the paged KV cache from a
// token or byte budget and gives the same blocks to the engine's KVCacheManager and to the
// ForwardRunner's cache memory (the one place both are derived from).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model.h"

namespace ember {

struct ModelEngineOptions {
  int64_t n_ctx = 0;      // tokens one request may reach; <= 0: min(n_ctx_train, 4096)
  int max_num_seqs = 16;  // requests running at once ("--parallel")
  int64_t kv_tokens = 0;  // KV budget in tokens; 0: see kv_bytes
  int64_t kv_bytes = 0;   // KV budget in bytes when kv_tokens is 0; both 0: the
                          // default (n_ctx * max_num_seqs tokens, at most
                          // kDefaultKVBytes and, on a GPU, kDeviceKVShare of its
                          // free memory; at least n_ctx)
  int block_size = 16;
  int64_t max_num_batched_tokens = 512;  // token budget of one step
  int64_t max_queue = 0;                 // waiting requests at most; 0: no limit
  bool enable_prefix_caching = true;
  std::string kv_type = "f16";    // KV cache rows: "f16", or "q8_0" (34 bytes per 32 values
                                  // instead of 64: ~1.9x the tokens in a byte budget, slightly
                                  // less exact; needs head_dim % 32 == 0)
  bool rows_independent = true;   // see ForwardRunnerConfig: output never depends on batching
  SpeculationConfig speculation;  // source draft_model needs the draft model below
};

inline constexpr int64_t kDefaultKVBytes = int64_t{1} << 30;
// The share of a GPU's free memory (Backend::device_memory) the default KV budget may take.
inline constexpr double kDeviceKVShare = 0.8;

// The KV cache type `name` ("f16" or "q8_0") as the model's backend would store it. Throws
// Unsupported, listing both, for another name; and for q8_0 when the backend lacks it or the
// model's head_dim is not a multiple of 32.
DType model_engine_kv_type(const Model& model, const std::string& name);

// The engine's configuration for `model` and `options` (no memory allocated). Throws
// InvalidArgument for bad sizes, Unsupported like model_engine_kv_type.
EngineConfig model_engine_config(const Model& model, const ModelEngineOptions& options);

// Starts an engine with a ForwardRunner over `model`, and with `draft` (may be null) as the
// draft model of speculation, over a KV cache with as many blocks as the model's. Throws like
// model_engine_config, and InvalidArgument for a draft model of another vocabulary.
std::unique_ptr<Engine> make_model_engine(std::shared_ptr<const Model> model,
                                          const ModelEngineOptions& options,
                                          std::shared_ptr<const Model> draft = nullptr);

}  // namespace ember
