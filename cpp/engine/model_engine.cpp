// engine/model_engine.cpp: KV sizing and the wiring of Engine + ForwardRunner.
#include "engine/model_engine.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

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

uint64_t model_identity(const GGUFFile& file) {
  const auto bytes = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&v), sizeof v);
  };
  const uint64_t n_file_bytes = file.file_bytes();
  uint64_t h = payload_checksum(bytes(n_file_bytes));
  for (const GGUFTensorInfo& t : file.tensors()) {
    h = payload_checksum({reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size()}, h);
    const int32_t type = static_cast<int32_t>(t.type);
    h = payload_checksum(bytes(type), h);
    h = payload_checksum({reinterpret_cast<const uint8_t*>(t.shape.data()), t.shape.size() * sizeof(int64_t)},
                         h);
    h = payload_checksum(bytes(t.offset), h);
    h = payload_checksum({t.data, static_cast<size_t>(std::min<uint64_t>(t.n_bytes, 4096))}, h);
  }
  return h;
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
  config.block_layout.model_id = model_identity(model.file());
  config.block_layout.kv_type = static_cast<uint32_t>(kv_type);
  config.block_layout.block_size = o.block_size;
  config.block_layout.n_layer = static_cast<int32_t>(c.n_layer);
  config.block_layout.n_head_kv = static_cast<int32_t>(c.n_head_kv);
  config.block_layout.head_dim = static_cast<int32_t>(c.head_dim);
  config.block_layout.payload_bytes = c.n_layer * 2 * o.block_size * ember::row_bytes(kv_type, c.n_kv_dim());
  return config;
}

std::unique_ptr<Engine> make_model_engine(std::shared_ptr<const Model> model, const EngineOptions& options,
                                          std::shared_ptr<const Model> draft,
                                          std::vector<std::shared_ptr<const LoraAdapter>> adapters,
                                          std::shared_ptr<VisionModel> vision) {
  if (!model) throw InvalidArgument("[engine] no model");
  EngineConfig config = model_engine_config(*model, options);
  if (options.cache_dir) {
    DiskCacheConfig disk;
    disk.dir = *options.cache_dir;
    disk.max_bytes = options.cache_disk_bytes;
    disk.layout = config.block_layout;
    config.kv.disk = std::make_shared<DiskCache>(std::move(disk));
  }
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
  auto forward = std::make_unique<ForwardRunner>(std::move(model), runner, std::move(adapters),
                                                 std::move(vision));
  if (forward->block_payload_bytes() != config.block_layout.payload_bytes) {
    throw std::logic_error(cat("[engine] a block's K/V takes ", forward->block_payload_bytes(),
                               " bytes, the disk layout says ", config.block_layout.payload_bytes));
  }
  return std::make_unique<Engine>(config, std::move(forward), std::move(drafter));
}

}  // namespace ember
