// model/model.cpp: loading — config, backend, weight binding, and RoPE frequencies.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ember {

namespace {

// YaRN's frequencies (transformers' _compute_yarn_parameters, in f32 where it computes in f32):
// frequency i is 1 / base^(2i/n_rot) (extrapolation) below the correction dim `low`, that divided
// by the factor (interpolation) above `high`, and the two mixed linearly between.
std::vector<float> yarn_inv_freqs(const ModelConfig& c) {
  const double dim = static_cast<double>(c.n_rot), base = c.rope_freq_base,
               two_pi = 2.0 * 3.14159265358979323846;
  auto correction_dim = [&](double n_rotations) {
    return dim * std::log(static_cast<double>(c.n_ctx_orig) / (n_rotations * two_pi)) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(c.rope_yarn_beta_fast), high = correction_dim(c.rope_yarn_beta_slow);
  if (c.rope_yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // as transformers, against a zero-width ramp
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  std::vector<float> out(c.n_rot / 2);
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    const float pos_freq = std::pow(c.rope_freq_base,
                                    static_cast<float>(2 * i) / static_cast<float>(c.n_rot));
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // transformers' inv_freq_extrapolation_factor
    out[i] = 1.0f / (c.rope_yarn_factor * pos_freq) * (1.0f - extrapolation) +
             1.0f / pos_freq * extrapolation;
  }
  return out;
}

}  // namespace

std::shared_ptr<Model> Model::load(const std::string& path, const ModelOptions& options) {
  std::shared_ptr<Backend> backend = make_backend(options.backend, options.n_threads);
  // "auto" picks a device that runs the model: a GPU without the mixture-of-experts ops (or
  // gpt-oss's, whose experts need them all) leaves a MoE model to the CPU (an explicit device that lacks them
  // is refused by load_with).
  if (options.backend == "auto" && !(backend->supports(Op::add_rows_scaled, DType::f32) &&
                                     backend->supports(Op::swiglu_oai, DType::f32))) {
    const std::shared_ptr<GGUFFile> file = GGUFFile::open(path);
    const std::string arch = file->get_string("general.architecture");
    if (file->get_int(arch + ".expert_count", 0) > 0) backend = make_backend("cpu", options.n_threads);
  }
  return load_with(path, std::move(backend));
}

std::shared_ptr<Model> Model::load_on(const std::string& path, const Model& host) {
  return load_with(path, host.backend_);
}

std::shared_ptr<Model> Model::load_with(const std::string& path, std::shared_ptr<Backend> backend) {
  std::shared_ptr<Model> model(new Model());
  model->file_ = GGUFFile::open(path);
  model->config_ = read_config(*model->file_);
  model->backend_ = std::move(backend);
  // The encoders (bert) run on the CPU only: their pooling and embedding reads use host memory
  // (device_memory() is the backends with memory of their own).
  if (model->config_.is_encoder() && model->backend_->device_memory()) {
    throw Unsupported(cat("[model] ", path, ": ", model->config_.arch->name,
                          " models run on the cpu backend only, not on the ", model->backend_->name(),
                          " backend; use --device cpu"));
  }
  if (model->config_.is_moe() && !model->backend_->supports(Op::add_rows_scaled, DType::f32)) {
    throw Unsupported(cat("[model] ", path, ": ", model->config_.arch->name,
                          " (mixture of experts) is not supported on the ", model->backend_->name(),
                          " backend yet; use --device cpu"));
  }
  if (model->config_.swiglu_limit > 0.0f) {  // gpt-oss: attention sinks and the clamped SwiGLU
    for (Op op : {Op::attention_sinks, Op::swiglu_oai}) {
      if (!model->backend_->supports(op, DType::f32)) {
        throw Unsupported(cat("[model] ", path, ": ", model->config_.arch->name, " models need the ",
                              op_name(op), " op, which the ", model->backend_->name(),
                              " backend lacks; use --device cpu"));
      }
    }
  }
  model->weights_ = bind_weights(*model->file_, model->config_, *model->backend_);
  model->prepare_weights();

  // inv_freq[i] = freq_scale * base^(-2i/n_rot) / factor[i], in f32 like transformers computes it;
  // the factors of llama3-style scaling, or LongRoPE's short ones (its long ones in a table of
  // their own).
  const ModelConfig& c = model->config_;
  const ModelWeights& w = model->weights_;
  auto inv_freqs = [&](const WeightTensor& factors, const char* name) {
    std::vector<float> inv_freq(c.n_rot / 2);
    for (int64_t i = 0; i < c.n_rot / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.n_rot);
      inv_freq[i] = 1.0f / std::pow(c.rope_freq_base, exponent) * c.rope_freq_scale;
      if (!factors) continue;
      const float factor = factors.f32()[i];
      if (!(factor > 0.0f)) {
        throw FormatError(
            cat("[model] ", path, ": tensor '", name, "': factor ", i, " is ", factor, ", expected > 0"));
      }
      inv_freq[i] /= factor;
    }
    return inv_freq;
  };
  model->rope_inv_freq_ = w.rope_factors_short ? inv_freqs(w.rope_factors_short, "rope_factors_short.weight")
                                               : inv_freqs(w.rope_freqs, "rope_freqs.weight");
  if (c.rope_yarn) model->rope_inv_freq_ = yarn_inv_freqs(c);
  if (w.rope_factors_long)
    model->rope_inv_freq_long_ = inv_freqs(w.rope_factors_long, "rope_factors_long.weight");
  if (c.swa_own_rope) {  // gemma's local layers: their own base, no scaling or factors
    model->rope_inv_freq_swa_.resize(c.n_rot / 2);
    for (int64_t i = 0; i < c.n_rot / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.n_rot);
      model->rope_inv_freq_swa_[i] = 1.0f / std::pow(c.rope_freq_base_swa, exponent);
    }
  }
  return model;
}

void Model::prepare_weights() {
  ModelWeights& w = weights_;
  // Before the matmul weights take the mapping's pages away (a tied output shares token_embd).
  std::vector<WeightTensor*> op_tensors = {&w.token_embd, &w.output_norm};
  for (LayerWeights& l : w.layers) {
    for (WeightTensor* t :
         {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm,
          &l.ffn_norm, &l.bo, &l.attn_sinks, &l.moe.router_b, &l.moe.gate_b, &l.moe.up_b, &l.moe.down_b})
      op_tensors.push_back(t);
  }
  for (WeightTensor* t : op_tensors) {
    if (!*t) continue;
    Buffer b = backend_->wrap_host(t->data, static_cast<size_t>(row_bytes(t->type, t->ne0) * t->ne1));
    t->data = b.data();
    op_weights_.push_back(std::move(b));
  }

  std::vector<WeightTensor*> tensors = {&w.output};
  for (LayerWeights& l : w.layers) {
    for (WeightTensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down})
      tensors.push_back(t);
    for (WeightTensor* t : l.moe.matmul_weights()) tensors.push_back(t);
  }
  // Absent ones: an encoder's output head, bert's gate, a MoE layer's dense ones.
  std::erase_if(tensors, [](const WeightTensor* t) { return !*t; });
  auto file_bytes = [](const WeightTensor* t) {
    return static_cast<size_t>(row_bytes(t->type, t->ne0) * t->ne1);
  };
  // The packers read 16 rows of a tensor side by side: from a cold page cache, each fault waited
  // for its own read (1.1B Q4_0, 637 MB, 2 threads: 7.8 s to load, 82 MB/s, where `dd` read a
  // cold file at 234 MB/s). So the file's pages are asked for ahead of the packers, up to
  // kReadAhead bytes of tensors ahead (a bound, so that a model larger than memory is not read
  // twice). Asking one tensor ahead loaded the 2.2 GB f16 file cold at 149 MB/s; this window, the
  // Q4_0 from the VM host's cache (the guest's dropped), four alternating loads 0.42-1.60 ->
  // 0.48-0.65 s (no cold file was left to time it on).
  constexpr size_t kReadAhead = size_t{512} << 20;
  size_t asked = 0, prepared = 0;
  size_t next = 0;  // the first tensor not yet asked for
  for (size_t i = 0; i < tensors.size(); ++i) {
    WeightTensor* t = tensors[i];
    for (; next < tensors.size() && (next <= i || asked - prepared < kReadAhead); ++next) {
      file_->will_need(tensors[next]->data, file_bytes(tensors[next]));
      asked += file_bytes(tensors[next]);
    }
    prepared += file_bytes(t);
    Buffer b = backend_->prepare_matmul_weight(t->type, t->data, t->ne0, t->ne1);
    if (b.data() != t->data) {
      // A copy: the file's bytes are read again only where another use shares them (a tied
      // output's token_embd rows, read by get_rows, come back from the page cache as needed).
      file_->drop_pages(t->data, file_bytes(t));
      t->data = b.data();
    }
    matmul_weights_.push_back(std::move(b));
  }
}

RopeParams Model::rope_params(int64_t il, bool long_context) const {
  RopeParams params;
  params.layout = config_.arch->rope_layout;
  params.n_rot = config_.n_rot;
  params.mscale = config_.rope_attn_factor;
  if (config_.swa_own_rope && config_.is_swa(il)) {
    params.inv_freq = rope_inv_freq_swa_.data();
  } else {
    params.inv_freq = long_context && !rope_inv_freq_long_.empty() ? rope_inv_freq_long_.data()
                                                                   : rope_inv_freq_.data();
  }
  return params;
}

}  // namespace ember
