// engine/model_engine.cpp: KV sizing and the wiring of Engine + ForwardRunner.
#include "engine/model_engine.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "engine/draft_model.h"
#include "engine/model_runner_forward.h"
#include "kv/paged_kv_cache.h"
#include "model/context.h"

namespace ember {

DType model_engine_kv_type(const Model& model, const std::string& name) {
  check_kv_type(name);
  const DType type = name == "q8_0" ? DType::q8_0 : DType::f16;
  if (!model.backend().supports(Op::store_kv, type) || !model.backend().supports(Op::attention, type)) {
    throw Unsupported(cat("[engine] the ", model.backend().name(), " backend has no ", name, " KV cache"));
  }
  PagedKVCache::check_type(type, model.config().head_dim);
  return type;
}

namespace {

SpeculationConfig speculation_config(const EngineOptions& o) {
  SpeculationConfig s;
  if (o.spec == "ngram") {
    s.source = DraftSource::ngram;
  } else if (o.spec == "draft" || o.draft_model) {
    s.source = DraftSource::draft_model;
  }
  s.draft_max = o.draft_max;
  s.draft_min = o.draft_min;
  s.adaptive = o.spec_adaptive;
  return s;
}

}  // namespace

EngineConfig model_engine_config(const Model& model, const EngineOptions& o) {
  o.check();
  const ModelConfig& c = model.config();
  const DType kv_type = model_engine_kv_type(model, o.kv_type);
  const int64_t n_ctx = o.n_ctx.value_or(std::min(c.n_ctx_train, Context::kDefaultMaxCtx));
  const int64_t bytes_per_token = PagedKVCache::bytes_per_token(c.n_layer, c.n_kv_dim(), kv_type);
  int64_t n_blocks;
  if (o.kv_size) {
    n_blocks = KVCacheConfig::blocks_for_tokens(*o.kv_size, o.block_size);
  } else if (o.kv_bytes) {
    n_blocks = KVCacheConfig::blocks_for_bytes(*o.kv_bytes, bytes_per_token, o.block_size);
  } else {
    const int64_t wanted = n_ctx * o.parallel;
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
  config.kv.prefix_caching = o.prefix_caching;
  // A window on every layer (Mistral) lets blocks behind it go; one global layer keeps them all.
  bool every_layer_windowed = c.sliding_window > 0;
  for (int64_t il = 0; il < c.n_layer; ++il) every_layer_windowed = every_layer_windowed && c.is_swa(il);
  config.kv.window = every_layer_windowed ? c.sliding_window : 0;
  config.scheduler.max_batch_tokens = o.max_batch_tokens;
  config.scheduler.parallel = o.parallel;
  config.scheduler.max_model_len = n_ctx;
  config.max_queue = o.max_queue;
  config.speculation = speculation_config(o);
  return config;
}

std::unique_ptr<Engine> make_model_engine(std::shared_ptr<const Model> model, const EngineOptions& options,
                                          std::shared_ptr<const Model> draft) {
  if (!model) throw InvalidArgument("[engine] no model");
  const EngineConfig config = model_engine_config(*model, options);
  std::unique_ptr<DraftModel> drafter;
  if (draft) {
    check_same_vocabulary(*model, *draft);
    DraftModelConfig dc;
    dc.n_blocks = config.kv.n_blocks;
    dc.n_ctx = config.scheduler.max_model_len;
    dc.block_size = config.kv.block_size;
    dc.max_batch_rows = config.scheduler.max_batch_tokens;
    drafter = std::make_unique<ModelDrafter>(std::move(draft), dc);
  }
  ForwardRunnerConfig runner;
  runner.n_blocks = config.kv.n_blocks;
  runner.n_ctx = config.scheduler.max_model_len;
  runner.block_size = config.kv.block_size;
  runner.max_batch_tokens = config.scheduler.max_batch_tokens;
  runner.parallel = config.scheduler.parallel;
  runner.batch_invariant = options.batch_invariant;
  runner.kv_type = model_engine_kv_type(*model, options.kv_type);
  return std::make_unique<Engine>(config, std::make_unique<ForwardRunner>(std::move(model), runner),
                                  std::move(drafter));
}

}  // namespace ember
