// vision/vision_model.h: a vision projector ("mmproj") — the image encoder of a multimodal model
// and the projector that maps its output into the language model's embedding space — loaded
// from a GGUF in llama.cpp's `clip` layout (general.architecture "clip"; the keys clip.vision.*,
// clip.projector_type; the tensors v.* of the tower and mm.* of the projector: see
// llama.cpp's tools/mtmd/clip-impl.h). ember's converter writes that layout, and llama.cpp's own
// mmproj files load here as they are.
//
// One tower per projector type, one file each (vision/gemma3.cpp: SigLIP + the Gemma 3
// projector; vision/qwen25vl.cpp: Qwen2.5-VL's ViT + merger), picked by clip.projector_type
// through kTowers in vision_model.cpp, the one table a new tower adds itself to. A tower binds
// its tensors at load (VisionBinder), and encode() runs every op through the Backend, so each
// runs on whatever backend the language model runs on (CPU, Vulkan).
//
// What an encoder takes: preprocessed pixels, f32 [3, height, width] (planar RGB, resized and
// normalized with the file's image_mean / image_std by the Python side's preprocessing hook,
// ember.vision.preprocess, per projector type). What it gives: embeddings [n_tokens, n_embd]
// (host memory), n_embd the language model's width (clip.vision.projection_dim), which the
// engine places at the image's token positions of a prompt.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "gguf/gguf.h"
#include "model/weights.h"

namespace ember {

class Model;

// The clip.vision.* hyper-parameters every tower reads (a tower reads its own extra keys from
// VisionModel::file()).
struct VisionConfig {
  std::string projector_type;  // clip.projector_type (or clip.vision.projector_type): "gemma3", ...
  int64_t image_size = 0;      // clip.vision.image_size: the side a fixed-size tower resizes to
  int64_t patch_size = 0;      // clip.vision.patch_size
  int64_t n_embd = 0;          // clip.vision.embedding_length: the tower's width
  int64_t n_ff = 0;            // clip.vision.feed_forward_length
  int64_t n_layer = 0;         // clip.vision.block_count
  int64_t n_head = 0;          // clip.vision.attention.head_count
  float eps = 1e-6f;           // clip.vision.attention.layer_norm_epsilon
  int64_t n_embd_out = 0;      // clip.vision.projection_dim: the language model's width
  std::array<float, 3> image_mean = {0.5f, 0.5f, 0.5f};  // clip.vision.image_mean (RGB)
  std::array<float, 3> image_std = {0.5f, 0.5f, 0.5f};   // clip.vision.image_std
  int64_t spatial_merge_size = 0;  // clip.vision.spatial_merge_size (Qwen2.5-VL), 0 when absent
  int64_t n_merge =
      0;  // Gemma 3: patches per side pooled into one token (clip.vision.projector.scale_factor, 4)

  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
};

class VisionModel;

// One projector type's encoder: its tensors (bound at construction) and its forward pass.
class VisionTower {
 public:
  virtual ~VisionTower() = default;
  // The image side lengths (pixels) preprocessing resizes an image of width x height to, for
  // this tower: fixed (gemma3: image_size x image_size) or the image's own rounded to patches.
  virtual std::array<int64_t, 2> preprocessed_size(int64_t width, int64_t height) const = 0;
  // Tokens the image of preprocessed size width x height becomes (its run in the prompt).
  virtual int64_t n_tokens(int64_t width, int64_t height) const = 0;
  // out[n_tokens(width, height), n_embd_out] (host) = the embeddings of pixels [3, height, width]
  // (host, f32, normalized). Width and height must be what preprocessed_size gives (VisionModel::
  // encode checks). Runs on the engine's thread only: the backend is not shared across threads.
  virtual void encode(const float* pixels, int64_t width, int64_t height, float* out) = 0;
  // Whether the language model's attention over an image's tokens is bidirectional within the
  // image (Gemma 3, as transformers masks it and llama.cpp decodes it) rather than causal.
  virtual bool image_attends_both_ways() const { return false; }
};

class VisionModel {
 public:
  // Opens an mmproj GGUF and binds its tower on `backend` (a language model's: Model's
  // shared_backend()). Throws FormatError naming the file and key or tensor, Unsupported for a
  // projector type ember has no tower for (naming those it has).
  static std::unique_ptr<VisionModel> load(const std::string& path, std::shared_ptr<Backend> backend);

  const GGUFFile& file() const { return *file_; }
  const VisionConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }
  VisionTower& tower() const { return *tower_; }

  // Checks the sizes (InvalidArgument: not the tower's preprocessed size) and encodes:
  // embeddings [n_tokens, n_embd_out] of pixels [3, height, width].
  std::vector<float> encode(const float* pixels, int64_t width, int64_t height) const;

 private:
  VisionModel() = default;
  std::shared_ptr<GGUFFile> file_;
  VisionConfig config_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<VisionTower> tower_;
};

// Binds a tower's tensors: checks presence, shape and dtype, and makes them backend-readable
// (matmul weights through prepare_matmul_weight, the rest through wrap_host); owns those buffers
// (a tower keeps its binder).
class VisionBinder {
 public:
  VisionBinder(const GGUFFile& file, Backend& backend) : file_(file), backend_(backend) {}
  // A matmul weight {n_in, n_out} (ggml order; a 4-D conv kernel {k, k, c, n_out} binds as
  // {k*k*c, n_out} when n_in is its product), any dtype the backend's matmul takes.
  WeightTensor matmul(const std::string& name, int64_t n_in, int64_t n_out, bool optional = false);
  // The transpose of a stored {n_out, n_in} f32/f16 matrix, as a matmul weight {n_in, n_out}
  // (Gemma 3's mm.input_projection.weight is stored as transformers multiplies it, x · W).
  WeightTensor matmul_transposed(const std::string& name, int64_t n_in, int64_t n_out);
  // An f32 vector or matrix read by element-wise ops (norms, biases, position embeddings) of
  // exactly `n` values; f16 files are widened to f32.
  WeightTensor f32(const std::string& name, int64_t n, bool optional = false);
  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

 private:
  const GGUFTensorInfo& find(const std::string& name) const;
  const GGUFFile& file_;
  Backend& backend_;
  std::vector<Buffer> buffers_;
  std::vector<std::vector<float>> widened_;  // host copies (f16 -> f32, transposes) behind buffers_
};

// The towers (vision_model.cpp's kTowers holds these): each file defines its maker.
std::unique_ptr<VisionTower> make_gemma3_tower(const VisionModel& model);
std::unique_ptr<VisionTower> make_qwen25vl_tower(const VisionModel& model);

}  // namespace ember
