// model/model.h: a loaded model — its file mapping, hyper-parameters, weights and the backend
// they are bound to. Immutable after load and shared by the engine's runner and by Contexts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace ember {

struct ModelOptions {
  int n_threads = 0;            // threads of the CPU backend's pool; <= 0: physical cores
  std::string backend = "cpu";  // a device: "cpu", "cuda[:N]", "vulkan[:N]" or "auto" (see make_backend)
};

class Model {
 public:
  // Opens, validates and binds a GGUF model. Throws FormatError / Unsupported with the file,
  // the key or tensor, and what was expected.
  static std::shared_ptr<Model> load(const std::string& path, const ModelOptions& options = {});
  // The same, on the backend of an already loaded model (a draft model runs on its target's
  // threads: two pools on the same cores would spin against each other).
  static std::shared_ptr<Model> load_on(const std::string& path, const Model& host);

  const GGUFFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // Ops run on the backend from const methods of their callers: the backend is the model's
  // executor, not part of its value.
  Backend& backend() const { return *backend_; }
  // The same backend, shared: for what runs beside the model on it (a vision projector).
  std::shared_ptr<Backend> shared_backend() const { return backend_; }
  // RoPE of layer il (local sliding-window layers have their own frequencies); long_context:
  // LongRoPE's long factors (see uses_long_rope).
  RopeParams rope_params(int64_t il = 0, bool long_context = false) const;
  // Whether a cache whose sequences may reach n_ctx_seq tokens rotates with LongRoPE's long
  // factors: it has them, and n_ctx_seq is past the original context. The choice holds for the
  // cache's whole life, as in llama.cpp, so that every cached key was rotated by the same
  // frequencies as the queries that read it. (transformers instead picks per forward call by the
  // call's largest position, so a sequence crossing the original context during generation would
  // hold keys of both kinds.)
  bool uses_long_rope(int64_t n_ctx_seq) const {
    return !rope_inv_freq_long_.empty() && n_ctx_seq > config_.n_ctx_orig;
  }

 private:
  Model() = default;
  static std::shared_ptr<Model> load_with(const std::string& path, std::shared_ptr<Backend> backend);
  // Hands every matmul weight to the backend (see matmul_weights_), and every other tensor an op
  // reads (embeddings, norms, biases) to its wrap_host (in place on the CPU, a device copy on a
  // GPU: uploaded once, here).
  void prepare_weights();

  std::shared_ptr<GGUFFile> file_;
  ModelConfig config_;
  std::shared_ptr<Backend> backend_;  // shared by models loaded with load_on
  ModelWeights weights_;
  // The matmul weights as the backend reads them (Backend::prepare_matmul_weight): views of the
  // mapping, or the backend's repacked copies, which weights_' matmul tensors then point into.
  std::vector<Buffer> matmul_weights_;
  std::vector<Buffer> op_weights_;         // the other tensors ops read, as the backend reads them
  std::vector<float> rope_inv_freq_;       // [n_rot / 2], scaling and frequency factors folded in
  std::vector<float> rope_inv_freq_long_;  // [n_rot / 2] with LongRoPE's long factors; empty: none
  std::vector<float> rope_inv_freq_swa_;   // [n_rot / 2] of sliding-window layers; empty: none
};

}  // namespace ember
