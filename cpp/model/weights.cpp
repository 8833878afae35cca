// model/weights.cpp: binds the tensors of every supported architecture by their llama.cpp names
// and validates them.
#include "model/weights.h"

#include <algorithm>

#include "core/error.h"

namespace ember {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  return s + "]";
}

// How a tensor is used decides which dtypes are acceptable.
enum class Use { matmul, table, f32 };

class Binder {
 public:
  Binder(const GGUFFile& file, const Backend& backend) : file_(file), backend_(backend) {}

  // The tensor `name` with ggml shape `shape`, or an absent tensor when optional and missing.
  WeightTensor bind(const std::string& name, std::vector<int64_t> shape, Use use,
                    bool optional = false) const {
    const GGUFTensorInfo* info = file_.find_tensor(name);
    if (!info) {
      if (optional) return {};
      throw FormatError(
          cat(where(name), "missing (", file_.get_string("general.architecture"), " models need it)"));
    }
    if (info->shape != shape) {
      throw FormatError(
          cat(where(name), "expected shape ", shape_string(shape), ", got ", shape_string(info->shape)));
    }
    check_type(name, info->type, use);
    WeightTensor t;
    t.type = info->type;
    t.data = info->data;
    t.ne0 = shape[0];
    t.ne1 = shape.size() > 1 ? shape[1] : 1;
    return t;
  }

  void check_type(const std::string& name, DType type, Use use) const {
    switch (use) {
      case Use::f32:
        if (type != DType::f32) {
          throw FormatError(cat(where(name), "expected type f32, got ", dtype_name(type)));
        }
        break;
      case Use::matmul:
        if (!backend_.supports(Op::matmul, type)) {
          throw Unsupported(cat(where(name), "type ", dtype_name(type), " is not supported by the ",
                                backend_.name(), " backend's matmul"));
        }
        break;
      case Use::table:
        if (!backend_.supports(Op::get_rows, type)) {
          throw Unsupported(cat(where(name), "type ", dtype_name(type), " cannot be read by the ",
                                backend_.name(), " backend"));
        }
        break;
    }
  }

  std::string where(const std::string& name) const {
    return cat("[model] ", file_.path(), ": tensor '", name, "': ");
  }

 private:
  const GGUFFile& file_;
  const Backend& backend_;
};

// Output rows [first, first + n) of a matmul weight {n_in, n_out}: a view, as rows are contiguous.
WeightTensor rows_of(const WeightTensor& t, int64_t first, int64_t n) {
  WeightTensor view = t;
  view.data = static_cast<const uint8_t*>(t.data) + first * row_bytes(t.type, t.ne0);
  view.ne1 = n;
  return view;
}

// A mixture-of-experts feed-forward: the router, each expert's slice of the 3-D expert tensors
// as a matmul weight of its own, and the shared expert where the architecture has one.
MoeLayerWeights bind_moe_layer(const Binder& b, const std::string& blk, const ModelConfig& c) {
  MoeLayerWeights m;
  const int64_t n_embd = c.n_embd, n_ff = c.n_ff_exp, n_expert = c.n_expert;
  m.router = b.bind(blk + "ffn_gate_inp.weight", {n_embd, n_expert}, Use::matmul);
  const WeightTensor gate = b.bind(blk + "ffn_gate_exps.weight", {n_embd, n_ff, n_expert}, Use::matmul);
  const WeightTensor up = b.bind(blk + "ffn_up_exps.weight", {n_embd, n_ff, n_expert}, Use::matmul);
  const WeightTensor down = b.bind(blk + "ffn_down_exps.weight", {n_ff, n_embd, n_expert}, Use::matmul);
  for (int64_t e = 0; e < n_expert; ++e) {  // expert e: output rows [e * n_out, (e + 1) * n_out)
    m.gate.push_back(rows_of(gate, e * n_ff, n_ff));
    m.up.push_back(rows_of(up, e * n_ff, n_ff));
    m.down.push_back(rows_of(down, e * n_embd, n_embd));
  }
  if (c.expert_bias) {
    m.router_b = b.bind(blk + "ffn_gate_inp.bias", {n_expert}, Use::f32);
    m.gate_b = b.bind(blk + "ffn_gate_exps.bias", {n_ff, n_expert}, Use::f32);
    m.up_b = b.bind(blk + "ffn_up_exps.bias", {n_ff, n_expert}, Use::f32);
    m.down_b = b.bind(blk + "ffn_down_exps.bias", {n_embd, n_expert}, Use::f32);
  }
  if (c.n_ff_shexp > 0) {
    m.shared_gate_inp = b.bind(blk + "ffn_gate_inp_shexp.weight", {n_embd, 1}, Use::matmul);
    m.shared_gate = b.bind(blk + "ffn_gate_shexp.weight", {n_embd, c.n_ff_shexp}, Use::matmul);
    m.shared_up = b.bind(blk + "ffn_up_shexp.weight", {n_embd, c.n_ff_shexp}, Use::matmul);
    m.shared_down = b.bind(blk + "ffn_down_shexp.weight", {c.n_ff_shexp, n_embd}, Use::matmul);
  }
  return m;
}

// bert: embeddings of tokens, token types and absolute positions summed and LayerNormed, then
// post-norm blocks whose every projection has a bias; no output head.
ModelWeights bind_bert_weights(const Binder& b, const GGUFFile& file, ModelConfig& c) {
  ModelWeights w;
  const int64_t n_embd = c.n_embd;
  w.token_embd = b.bind("token_embd.weight", {n_embd, c.n_vocab}, Use::table);
  const GGUFTensorInfo* types = file.find_tensor("token_types.weight");
  if (c.n_token_types <= 0 && types && types->shape.size() == 2) c.n_token_types = types->shape[1];
  w.token_types = b.bind("token_types.weight", {n_embd, std::max<int64_t>(c.n_token_types, 1)}, Use::table);
  w.position_embd = b.bind("position_embd.weight", {n_embd, c.n_ctx_train}, Use::table);
  w.token_embd_norm = b.bind("token_embd_norm.weight", {n_embd}, Use::f32);
  w.token_embd_norm_b = b.bind("token_embd_norm.bias", {n_embd}, Use::f32);
  w.layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string blk = cat("blk.", i, ".");
    l.wq = b.bind(blk + "attn_q.weight", {n_embd, c.n_q_dim()}, Use::matmul);
    l.bq = b.bind(blk + "attn_q.bias", {c.n_q_dim()}, Use::f32);
    l.wk = b.bind(blk + "attn_k.weight", {n_embd, c.n_kv_dim()}, Use::matmul);
    l.bk = b.bind(blk + "attn_k.bias", {c.n_kv_dim()}, Use::f32);
    l.wv = b.bind(blk + "attn_v.weight", {n_embd, c.n_kv_dim()}, Use::matmul);
    l.bv = b.bind(blk + "attn_v.bias", {c.n_kv_dim()}, Use::f32);
    l.wo = b.bind(blk + "attn_output.weight", {c.n_q_dim(), n_embd}, Use::matmul);
    l.bo = b.bind(blk + "attn_output.bias", {n_embd}, Use::f32);
    l.post_attn_norm = b.bind(blk + "attn_output_norm.weight", {n_embd}, Use::f32);
    l.post_attn_norm_b = b.bind(blk + "attn_output_norm.bias", {n_embd}, Use::f32);
    l.ffn_up = b.bind(blk + "ffn_up.weight", {n_embd, c.n_ff}, Use::matmul);
    l.ffn_up_b = b.bind(blk + "ffn_up.bias", {c.n_ff}, Use::f32);
    l.ffn_down = b.bind(blk + "ffn_down.weight", {c.n_ff, n_embd}, Use::matmul);
    l.ffn_down_b = b.bind(blk + "ffn_down.bias", {n_embd}, Use::f32);
    l.post_ffn_norm = b.bind(blk + "layer_output_norm.weight", {n_embd}, Use::f32);
    l.post_ffn_norm_b = b.bind(blk + "layer_output_norm.bias", {n_embd}, Use::f32);
  }
  return w;
}

}  // namespace

namespace {

// The matmul weights of a MoE layer, as pointers of Weights' constness.
template <typename Tensor, typename Moe>
std::vector<Tensor*> moe_matmul_weights(Moe& m) {
  std::vector<Tensor*> tensors = {&m.router, &m.shared_gate_inp, &m.shared_gate, &m.shared_up,
                                  &m.shared_down};
  for (auto* experts : {&m.gate, &m.up, &m.down}) {
    for (Tensor& t : *experts) tensors.push_back(&t);
  }
  return tensors;
}

}  // namespace

std::vector<WeightTensor*> MoeLayerWeights::matmul_weights() {
  return moe_matmul_weights<WeightTensor>(*this);
}

std::vector<const WeightTensor*> MoeLayerWeights::matmul_weights() const {
  return moe_matmul_weights<const WeightTensor>(*this);
}

ModelWeights bind_weights(const GGUFFile& file, ModelConfig& c, const Backend& backend) {
  const Binder b(file, backend);
  ModelWeights w;

  // The vocabulary size is whatever token_embd holds (vocab_size metadata is optional).
  const GGUFTensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd) throw FormatError(cat(b.where("token_embd.weight"), "missing"));
  if (embd->shape.size() != 2 || embd->shape[1] <= 0) {
    throw FormatError(cat(b.where("token_embd.weight"), "expected shape [", c.n_embd, ", n_vocab], got ",
                          shape_string(embd->shape)));
  }
  c.n_vocab = embd->shape[1];
  if (c.is_encoder()) return bind_bert_weights(b, file, c);
  w.token_embd = b.bind("token_embd.weight", {c.n_embd, c.n_vocab}, Use::table);
  w.output_norm = b.bind("output_norm.weight", {c.n_embd}, Use::f32);
  w.output = b.bind("output.weight", {c.n_embd, c.n_vocab}, Use::matmul, /*optional=*/true);
  if (!w.output) {
    b.check_type("token_embd.weight (tied output)", w.token_embd.type, Use::matmul);
    w.output = w.token_embd;
    w.tied_output = true;
  }
  w.rope_freqs = b.bind("rope_freqs.weight", {c.n_rot / 2}, Use::f32, /*optional=*/true);
  w.rope_factors_short = b.bind("rope_factors_short.weight", {c.n_rot / 2}, Use::f32, /*optional=*/true);
  w.rope_factors_long = b.bind("rope_factors_long.weight", {c.n_rot / 2}, Use::f32, /*optional=*/true);
  if (!w.rope_factors_short != !w.rope_factors_long || (w.rope_freqs && w.rope_factors_long)) {
    throw FormatError(
        cat(b.where(w.rope_factors_long ? "rope_factors_short.weight" : "rope_factors_long.weight"),
            "LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight, "
            "and no rope_freqs.weight beside them"));
  }

  const int64_t n_embd = c.n_embd, n_q = c.n_q_dim(), n_kv = c.n_kv_dim();
  w.layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string blk = cat("blk.", i, ".");
    l.attn_norm = b.bind(blk + "attn_norm.weight", {n_embd}, Use::f32);
    if (file.find_tensor(blk + "attn_qkv.weight")) {
      // Fused Q, K and V (phi3): their output rows one after the other, so each is a view.
      const WeightTensor qkv = b.bind(blk + "attn_qkv.weight", {n_embd, n_q + 2 * n_kv}, Use::matmul);
      l.wq = rows_of(qkv, 0, n_q);
      l.wk = rows_of(qkv, n_q, n_kv);
      l.wv = rows_of(qkv, n_q + n_kv, n_kv);
    } else {
      l.wq = b.bind(blk + "attn_q.weight", {n_embd, n_q}, Use::matmul);
      l.wk = b.bind(blk + "attn_k.weight", {n_embd, n_kv}, Use::matmul);
      l.wv = b.bind(blk + "attn_v.weight", {n_embd, n_kv}, Use::matmul);
    }
    if (c.arch->qkv_bias) {
      l.bq = b.bind(blk + "attn_q.bias", {n_q}, Use::f32);
      l.bk = b.bind(blk + "attn_k.bias", {n_kv}, Use::f32);
      l.bv = b.bind(blk + "attn_v.bias", {n_kv}, Use::f32);
    }
    if (c.arch->qk_norm) {
      l.q_norm = b.bind(blk + "attn_q_norm.weight", {c.head_dim}, Use::f32);
      l.k_norm = b.bind(blk + "attn_k_norm.weight", {c.head_dim}, Use::f32);
    }
    l.wo = b.bind(blk + "attn_output.weight", {n_q, n_embd}, Use::matmul);
    const bool gpt_oss = std::string_view(c.arch->name) == "gpt-oss";
    if (gpt_oss) {  // llama.cpp's names: its pre-MoE norm is the attention's post-norm
      l.bo = b.bind(blk + "attn_output.bias", {n_embd}, Use::f32);
      l.attn_sinks = b.bind(blk + "attn_sinks.weight", {c.n_head}, Use::f32);
    }
    l.ffn_norm = b.bind(blk + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), {n_embd},
                        Use::f32);
    if (c.is_moe()) {
      l.moe = bind_moe_layer(b, blk, c);
      continue;
    }
    if (file.find_tensor(blk + "ffn_gate.weight")) {
      l.ffn_gate = b.bind(blk + "ffn_gate.weight", {n_embd, c.n_ff}, Use::matmul);
      l.ffn_up = b.bind(blk + "ffn_up.weight", {n_embd, c.n_ff}, Use::matmul);
    } else {  // fused gate and up (phi3): gate's rows first, then up's
      const WeightTensor gate_up = b.bind(blk + "ffn_up.weight", {n_embd, 2 * c.n_ff}, Use::matmul);
      l.ffn_gate = rows_of(gate_up, 0, c.n_ff);
      l.ffn_up = rows_of(gate_up, c.n_ff, c.n_ff);
    }
    l.ffn_down = b.bind(blk + "ffn_down.weight", {c.n_ff, n_embd}, Use::matmul);
    if (c.arch->family == ArchFamily::gemma3) {
      l.post_attn_norm = b.bind(blk + "post_attention_norm.weight", {n_embd}, Use::f32);
      l.post_ffn_norm = b.bind(blk + "post_ffw_norm.weight", {n_embd}, Use::f32);
    }
  }
  return w;
}

}  // namespace ember
