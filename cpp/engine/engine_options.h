// engine/engine_options.h: the one definition of every engine option and its default. Bound as
// ember._core.EngineOptions; ember.Engine, ember.LLM, the CLI flags and the server's config read
// their defaults from it, and check() is the one check of their values. The engine's internal
// configs (SchedulerConfig, ForwardRunnerConfig, SpeculationConfig) default to these values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ember {

struct EngineOptions {
  std::optional<int64_t> n_ctx;     // tokens one request may reach (prompt and output); unset: the
                                    // model's training context, at most Context::kDefaultMaxCtx
  int parallel = 16;                // requests running at once ("--parallel")
  std::optional<int64_t> kv_size;   // KV cache budget in tokens; unset: see kv_bytes
  std::optional<int64_t> kv_bytes;  // KV cache budget in bytes when kv_size is unset; both unset:
                                    // n_ctx * parallel tokens, at most kDefaultKVBytes and, on a
                                    // GPU, kDeviceKVShare of its free memory; at least n_ctx
  int block_size = 16;              // tokens per KV block
  int64_t max_batch_tokens = 512;   // token budget of one step: rows of the largest batch
  int64_t max_queue = 0;            // requests waiting for one of the `parallel` slots at most;
                                    // 0: no limit
  bool prefix_caching = true;       // prompts with equal prefixes share their K/V (full blocks by
                                    // reference, a partly filled last block by a copy)
  std::string kv_type = "f16";      // KV cache rows: "f16", or "q8_0" (34 bytes per 32 values
                                    // instead of 64: ~1.9x the tokens in a byte budget, slightly
                                    // less exact; needs head_dim % 32 == 0)
  bool batch_invariant = true;      // a request's output never depends on what else runs (see
                                    // ForwardRunnerConfig)
  // Speculative decoding: "none", "ngram" (prompt lookup over each request's own text) or
  // "draft" (from draft_model); a request with a prediction drafts from it whatever spec says.
  std::string spec = "none";
  std::optional<std::string> draft_model;  // a draft .gguf of the same vocabulary (spec "draft")
  int draft_max = 16;                      // drafts per request and step at most
  int draft_min = 1;                       // a request given fewer drafts than this gets none
  bool spec_adaptive = true;               // draft only as deep as the measured step cost says
                                           // pays; false: always draft_max (tests, benchmarks)
  std::optional<std::string> mmproj;       // a vision projector .gguf (llama.cpp's clip layout):
                                           // prompts may hold images (vision/vision_model.h)
  std::optional<int> n_threads;            // CPU threads; unset: the physical cores
  std::string device = "auto";             // "cpu", "vulkan" / "vulkan:N", or "auto" (the first GPU, else
                                           // the CPU)

  // The prefix cache's disk tier (kv/disk_cache.h): full blocks also go to files in cache_dir,
  // and a later engine (a restart) reads a prompt's blocks back from them.
  std::optional<std::string> cache_dir;         // unset: memory only
  int64_t cache_disk_bytes = int64_t{2} << 30;  // the files in cache_dir at most (2 GiB); the least
                                                // recently used go first

  // Throws InvalidArgument naming the first bad value ("[engine] parallel must be >= 1, got 0"),
  // before any model is loaded. A model-dependent check (the backend's KV types, head_dim) is
  // model_engine_kv_type's.
  void check() const;
};

// Throws InvalidArgument unless `kv_type` names a KV cache type ("f16" or "q8_0").
void check_kv_type(const std::string& kv_type);

}  // namespace ember
