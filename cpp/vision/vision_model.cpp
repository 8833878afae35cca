// vision/vision_model.cpp: reads an mmproj GGUF's clip.vision.* keys, picks the tower of its
// projector type (kTowers: the one place a new tower is added), and binds tensors for towers.
#include "vision/vision_model.h"

#include <string_view>

#include "core/error.h"
#include "quant/types.h"

namespace ember {

namespace {

using TowerMaker = std::unique_ptr<VisionTower> (*)(const VisionModel&);

// clip.projector_type -> its tower. llama.cpp names Qwen2.5-VL's "qwen2.5vl_merger"; older
// files say "qwen25vl" (both go to the same tower once vision/qwen25vl.cpp adds itself here).
constexpr std::pair<std::string_view, TowerMaker> kTowers[] = {
    {"gemma3", make_gemma3_tower},
    {"qwen2.5vl_merger", make_qwen25vl_tower},
    {"qwen25vl", make_qwen25vl_tower},
};

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

VisionConfig read_vision_config(const GGUFFile& f) {
  const std::string where = cat("[vision] ", f.path(), ": ");
  const std::string arch = f.get_string("general.architecture");
  if (arch != "clip") {
    throw FormatError(cat(where, "general.architecture is '", arch,
                          "', expected 'clip' (a vision projector, as llama.cpp's --mmproj takes)"));
  }
  if (!f.get_bool("clip.has_vision_encoder", false)) {
    throw FormatError(cat(where, "clip.has_vision_encoder is not true: the file has no vision encoder"));
  }
  VisionConfig c;
  c.projector_type = f.get_string("clip.vision.projector_type", f.get_string("clip.projector_type"));
  auto need = [&](const char* key) {
    const int64_t v = f.get_int(key, 0);
    if (v <= 0) throw FormatError(cat(where, "key '", key, "' is missing or not positive"));
    return v;
  };
  c.image_size = need("clip.vision.image_size");
  c.patch_size = need("clip.vision.patch_size");
  c.n_embd = need("clip.vision.embedding_length");
  c.n_ff = need("clip.vision.feed_forward_length");
  c.n_layer = need("clip.vision.block_count");
  c.n_head = need("clip.vision.attention.head_count");
  c.n_embd_out = need("clip.vision.projection_dim");
  c.eps = static_cast<float>(f.get_float("clip.vision.attention.layer_norm_epsilon", 1e-6));
  if (c.n_embd % c.n_head != 0) {
    throw FormatError(
        cat(where, "embedding_length ", c.n_embd, " is not a multiple of head_count ", c.n_head));
  }
  for (auto [key, values] : {std::pair{"clip.vision.image_mean", &c.image_mean},
                             std::pair{"clip.vision.image_std", &c.image_std}}) {
    const std::vector<float> v = f.get_floats(key);
    if (v.empty()) continue;
    if (v.size() != 3) throw FormatError(cat(where, "key '", key, "' has ", v.size(), " values, expected 3"));
    for (int i = 0; i < 3; ++i) (*values)[i] = v[i];
  }
  for (float s : c.image_std) {
    if (!(s > 0.0f)) throw FormatError(cat(where, "clip.vision.image_std has ", s, ", expected > 0"));
  }
  c.spatial_merge_size = f.get_int("clip.vision.spatial_merge_size", 0);
  c.n_merge = f.get_int("clip.vision.projector.scale_factor", 0);
  return c;
}

}  // namespace

std::unique_ptr<VisionModel> VisionModel::load(const std::string& path, std::shared_ptr<Backend> backend) {
  std::unique_ptr<VisionModel> model(new VisionModel());
  model->file_ = GGUFFile::open(path);
  model->config_ = read_vision_config(*model->file_);
  model->backend_ = std::move(backend);
  std::string known;
  for (const auto& [type, make] : kTowers) {
    if (type == model->config_.projector_type) {
      model->tower_ = make(*model);
      return model;
    }
    known += cat(known.empty() ? "" : ", ", type);
  }
  throw Unsupported(cat("[vision] ", path, ": projector type '", model->config_.projector_type,
                        "' has no encoder in ember (it has: ", known, ")"));
}

std::vector<float> VisionModel::encode(const float* pixels, int64_t width, int64_t height) const {
  const auto [w, h] = tower_->preprocessed_size(width, height);
  if (w != width || h != height) {
    throw InvalidArgument(cat("[vision] pixels of ", width, "x", height, " are not preprocessed for the '",
                              config_.projector_type, "' encoder (it takes ", w, "x", h, ")"));
  }
  std::vector<float> out(static_cast<size_t>(tower_->n_tokens(width, height) * config_.n_embd_out));
  tower_->encode(pixels, width, height, out.data());
  return out;
}

const GGUFTensorInfo& VisionBinder::find(const std::string& name) const {
  const GGUFTensorInfo* info = file_.find_tensor(name);
  if (!info) throw FormatError(cat("[vision] ", file_.path(), ": tensor '", name, "' is missing"));
  return *info;
}

WeightTensor VisionBinder::matmul(const std::string& name, int64_t n_in, int64_t n_out, bool optional) {
  if (optional && !has(name)) return {};
  const GGUFTensorInfo& info = find(name);
  int64_t inner = 1;
  for (size_t i = 0; i + 1 < info.shape.size(); ++i) inner *= info.shape[i];
  if (info.shape.size() < 2 || inner != n_in || info.shape.back() != n_out) {
    throw FormatError(cat("[vision] ", file_.path(), ": tensor '", name, "': expected a matrix {", n_in, ", ",
                          n_out, "}, got ", shape_string(info.shape)));
  }
  if (!backend_.supports(Op::matmul, info.type)) {
    throw Unsupported(cat("[vision] ", file_.path(), ": tensor '", name, "': type ", dtype_name(info.type),
                          " is not supported by the ", backend_.name(), " backend's matmul"));
  }
  Buffer b = backend_.prepare_matmul_weight(info.type, info.data, n_in, n_out);
  WeightTensor t{info.type, b.data(), n_in, n_out};
  buffers_.push_back(std::move(b));
  return t;
}

namespace {

// The values of a tensor as f32 (widened from f16/bf16; any type the build can read).
std::vector<float> values_of(const GGUFFile& file, const GGUFTensorInfo& info) {
  const TypeTraits& traits = type_traits(info.type);
  if (!traits.dequantize_row) {
    throw Unsupported(cat("[vision] ", file.path(), ": tensor '", info.name, "': type ",
                          dtype_name(info.type), " cannot be read"));
  }
  std::vector<float> v(static_cast<size_t>(info.n_elements));
  traits.dequantize_row(info.data, v.data(), info.n_elements);
  return v;
}

}  // namespace

WeightTensor VisionBinder::matmul_transposed(const std::string& name, int64_t n_in, int64_t n_out) {
  const GGUFTensorInfo& info = find(name);
  if (info.shape != std::vector<int64_t>{n_out, n_in}) {
    throw FormatError(cat("[vision] ", file_.path(), ": tensor '", name, "': expected shape [", n_out, ", ",
                          n_in, "], got ", shape_string(info.shape)));
  }
  const std::vector<float> stored = values_of(file_, info);  // [n_in rows][n_out]
  std::vector<float>& t = widened_.emplace_back(stored.size());
  for (int64_t i = 0; i < n_in; ++i) {
    for (int64_t o = 0; o < n_out; ++o) t[o * n_in + i] = stored[i * n_out + o];
  }
  Buffer b = backend_.prepare_matmul_weight(DType::f32, t.data(), n_in, n_out);
  WeightTensor w{DType::f32, b.data(), n_in, n_out};
  buffers_.push_back(std::move(b));
  return w;
}

WeightTensor VisionBinder::f32(const std::string& name, int64_t n, bool optional) {
  if (optional && !has(name)) return {};
  const GGUFTensorInfo& info = find(name);
  if (info.n_elements != n) {
    throw FormatError(cat("[vision] ", file_.path(), ": tensor '", name, "': expected ", n, " values, got ",
                          shape_string(info.shape)));
  }
  const void* data = info.data;
  if (info.type != DType::f32) data = widened_.emplace_back(values_of(file_, info)).data();
  Buffer b = backend_.wrap_host(data, static_cast<size_t>(n) * sizeof(float));
  WeightTensor t{DType::f32, b.data(), info.shape.empty() ? n : info.shape[0],
                 info.shape.size() > 1 ? n / info.shape[0] : 1};
  buffers_.push_back(std::move(b));
  return t;
}

}  // namespace ember
