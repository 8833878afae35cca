// engine/model_engine.h: an Engine serving a loaded model — sizes the paged KV cache from a
// token or byte budget and gives the same blocks to the engine's KVCacheManager and to the
// ForwardRunner's cache memory (the one place both are derived from).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_options.h"
#include "model/lora.h"
#include "model/model.h"
#include "vision/vision_model.h"

namespace ember {

inline constexpr int64_t kDefaultKVBytes = int64_t{1} << 30;
// The share of a GPU's free memory (Backend::device_memory) the default KV budget may take.
inline constexpr double kDeviceKVShare = 0.8;

// The KV cache type `name` ("f16" or "q8_0") as the model's backend would store it. Throws
// InvalidArgument for another name (as EngineOptions::check), Unsupported for q8_0 when the
// backend lacks it or the model's head_dim is not a multiple of 32.
DType model_engine_kv_type(const Model& model, const std::string& name);

// The model's identity in disk cache and state files: a 64-bit hash of the GGUF's size, of every
// tensor's name, type, shape and offset, and of the first 4 KiB of each tensor's data — cheap
// (about 1 MB read for SmolLM2's 272 tensors, pages loading maps anyway) and different for
// another model, another quantization or another fine-tune of the same architecture.
uint64_t model_identity(const GGUFFile& file);

// The engine's configuration for `model` and `options` (no memory allocated). Throws like
// options.check() and model_engine_kv_type. options.draft_model is a path this does not open.
EngineConfig model_engine_config(const Model& model, const EngineOptions& options);

// Starts an engine with a ForwardRunner over `model`, and with `draft` (may be null) as the
// draft model of speculation, over a KV cache with as many blocks as the model's, and with a
// DiskCache in options.cache_dir when set (warnings on stderr); requests may pick one of
// `adapters` (LoRA adapters loaded for `model`; the draft model runs without them: its guesses
// are checked by the target anyway), and requests may hold images for `vision` (an mmproj loaded
// on the model's backend; may be null). Throws like model_engine_config, and InvalidArgument for a
// draft model of another vocabulary.
std::unique_ptr<Engine> make_model_engine(std::shared_ptr<const Model> model, const EngineOptions& options,
                                          std::shared_ptr<const Model> draft = nullptr,
                                          std::vector<std::shared_ptr<const LoraAdapter>> adapters = {},
                                          std::shared_ptr<VisionModel> vision = nullptr);

}  // namespace ember
