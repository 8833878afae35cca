// engine/model_engine.cpp: KV sizing and the wiring of Engine + ForwardRunner.
#include "engine/model_engine.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "engine/draft_model.h"
#include "engine/model_runner_forward.h"
#include "kv/paged_kv_cache.h"

namespace ember {

DType model_engine_kv_type(const Model& model, const std::string& name) {
  DType type;
  if (name == "f16") {
    type = DType::f16;
  } else if (name == "q8_0") {
    type = DType::q8_0;
  } else {
    throw Unsupported(
        cat("[engine] KV cache type '", name, "' is not supported; use f16 (the default) or q8_0"));
  }
  if (!model.backend().supports(Op::store_kv, type) || !model.backend().supports(Op::attention, type)) {
    throw Unsupported(cat("[engine] the ", model.backend().name(), " backend has no ", name, " KV cache"));
  }
  PagedKVCache::check_type(type, model.config().head_dim);
  return type;
}

EngineConfig model_engine_config(const Model& model, const ModelEngineOptions& o) {
  const ModelConfig& c = model.config();
  const DType kv_type = model_engine_kv_type(model, o.kv_type);
  if (o.block_size < 1 || o.max_num_seqs < 1 || o.max_num_batched_tokens < 1 || o.kv_tokens < 0 ||
      o.kv_bytes < 0) {
    throw InvalidArgument(cat("[engine] block_size (", o.block_size, "), parallel (", o.max_num_seqs,
                              ") and max_batch_tokens (", o.max_num_batched_tokens,
                              ") must be >= 1, KV budgets >= 0"));
  }
  const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min<int64_t>(c.n_ctx_train, 4096);
  const int64_t bytes_per_token = PagedKVCache::bytes_per_token(c.n_layer, c.n_kv_dim(), kv_type);
  int64_t n_blocks;
  if (o.kv_tokens > 0) {
    n_blocks = KVCacheConfig::blocks_for_tokens(o.kv_tokens, o.block_size);
  } else if (o.kv_bytes > 0) {
    n_blocks = KVCacheConfig::blocks_for_bytes(o.kv_bytes, bytes_per_token, o.block_size);
  } else {
    const int64_t wanted = n_ctx * o.max_num_seqs;
    int64_t budget_bytes = kDefaultKVBytes;
    // On a GPU the pool also fits in what the device has left after the weights (which are
    // uploaded by now): at most kDeviceKVShare of it, leaving room for the activations.
    if (const std::optional<DeviceMemory> m = model.backend().device_memory()) {
      budget_bytes = std::min(budget_bytes,
                              static_cast<int64_t>(static_cast<double>(m->free_bytes) * kDeviceKVShare));
    }
    const int64_t capped = std::max(n_ctx, std::min(wanted, budget_bytes / bytes_per_token));
    n_blocks = (capped + o.block_size - 1) / o.block_size;
  }

  EngineConfig config;
  config.kv.block_size = o.block_size;
  config.kv.n_blocks = n_blocks;
  config.kv.enable_prefix_caching = o.enable_prefix_caching;
  // A window on every layer (Mistral) lets blocks behind it go; one global layer keeps them all.
  bool every_layer_windowed = c.sliding_window > 0;
  for (int64_t il = 0; il < c.n_layer; ++il) every_layer_windowed = every_layer_windowed && c.is_swa(il);
  config.kv.window = every_layer_windowed ? c.sliding_window : 0;
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  config.scheduler.max_num_seqs = o.max_num_seqs;
  config.scheduler.max_model_len = n_ctx;
  config.max_queue = o.max_queue;
  config.speculation = o.speculation;
  return config;
}

std::unique_ptr<Engine> make_model_engine(std::shared_ptr<const Model> model,
                                          const ModelEngineOptions& options,
                                          std::shared_ptr<const Model> draft) {
  if (!model) throw InvalidArgument("[engine] no model");
  const EngineConfig config = model_engine_config(*model, options);
  std::unique_ptr<DraftModel> drafter;
  if (draft) {
    check_same_vocabulary(*model, *draft);
    DraftModelConfig dc;
    dc.n_blocks = config.kv.n_blocks;
    dc.block_size = config.kv.block_size;
    dc.max_batch_rows = config.scheduler.max_num_batched_tokens;
    drafter = std::make_unique<ModelDrafter>(std::move(draft), dc);
  }
  ForwardRunnerConfig runner;
  runner.n_blocks = config.kv.n_blocks;
  runner.block_size = config.kv.block_size;
  runner.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
  runner.max_num_seqs = config.scheduler.max_num_seqs;
  runner.rows_independent = options.rows_independent;
  runner.kv_type = model_engine_kv_type(*model, options.kv_type);
  return std::make_unique<Engine>(config, std::make_unique<ForwardRunner>(std::move(model), runner),
                                  std::move(drafter));
}

}  // namespace ember
