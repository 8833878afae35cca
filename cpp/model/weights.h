// model/weights.h: a model's weights as views of the GGUF tensors inside the file mapping — no
// copies (Model then hands the matmul weights to the backend, which may repack them: see
// Backend::prepare_matmul_weight). Binding checks every tensor's presence, shape and dtype once,
// at load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"
#include "gguf/gguf.h"
#include "model/config.h"

namespace ember {

// A tensor read in place. Shapes use ggml order: ne0 is contiguous, so a matmul weight
// {n_in, n_out} is n_out rows of n_in values in `type` blocks.
struct WeightTensor {
  DType type = DType::f32;
  const void* data = nullptr;  // nullptr: absent (optional tensors only)
  int64_t ne0 = 0;
  int64_t ne1 = 1;

  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }
  // This matmul weight's share of a Backend::matmul_many call, writing y [n_rows, ne1].
  MatmulOut into(float* y) const { return {type, data, ne1, y}; }
};

// A mixture-of-experts feed-forward (qwen2moe, qwen3moe, gpt-oss). The experts' weights are 3-D tensors
// {n_in, n_out, n_expert} in the file; each expert's slice is a matmul weight of its own here, so
// a step reads only the experts its tokens chose.
struct MoeLayerWeights {
  WeightTensor router;             // ffn_gate_inp {n_embd, n_expert}, any matmul dtype (f32 as written)
  WeightTensor router_b;           // ffn_gate_inp.bias [n_expert] f32, gpt-oss only
  std::vector<WeightTensor> gate;  // [n_expert] views of ffn_gate_exps: {n_embd, n_ff_exp} each
  std::vector<WeightTensor> up;    // [n_expert] views of ffn_up_exps: {n_embd, n_ff_exp}
  std::vector<WeightTensor> down;  // [n_expert] views of ffn_down_exps: {n_ff_exp, n_embd}
  WeightTensor gate_b;             // ffn_gate_exps.bias {n_ff_exp, n_expert} f32 (expert e: row e), gpt-oss
  WeightTensor up_b;               // ffn_up_exps.bias {n_ff_exp, n_expert} f32, gpt-oss
  WeightTensor down_b;             // ffn_down_exps.bias {n_embd, n_expert} f32, gpt-oss
  WeightTensor shared_gate_inp;    // ffn_gate_inp_shexp {n_embd, 1}: the shared expert's sigmoid gate
  WeightTensor shared_gate;        // ffn_gate_shexp {n_embd, n_ff_shexp}; absent: no shared expert
  WeightTensor shared_up;          // ffn_up_shexp {n_embd, n_ff_shexp}
  WeightTensor shared_down;        // ffn_down_shexp {n_ff_shexp, n_embd}

  explicit operator bool() const { return static_cast<bool>(router); }
  // Every matmul weight above (absent ones included), for preparing and type checks.
  std::vector<WeightTensor*> matmul_weights();
  std::vector<const WeightTensor*> matmul_weights() const;
};

struct LayerWeights {
  WeightTensor attn_norm;       // [n_embd] f32
  WeightTensor wq;              // {n_embd, n_q_dim}, any matmul dtype
  WeightTensor wk;              // {n_embd, n_kv_dim}
  WeightTensor wv;              // {n_embd, n_kv_dim}
  WeightTensor bq;              // [n_q_dim] f32, qwen2 only
  WeightTensor bk;              // [n_kv_dim] f32, qwen2 only
  WeightTensor bv;              // [n_kv_dim] f32, qwen2 only
  WeightTensor q_norm;          // [head_dim] f32, qwen3 and gemma3
  WeightTensor k_norm;          // [head_dim] f32, qwen3 and gemma3
  WeightTensor wo;              // {n_q_dim, n_embd}
  WeightTensor bo;              // [n_embd] f32, bert and gpt-oss
  WeightTensor attn_sinks;      // [n_head] f32, gpt-oss: each head's sink logit (AttentionParams::sinks)
  WeightTensor post_attn_norm;  // [n_embd] f32, gemma3: RMSNorm of the attention output
  WeightTensor post_ffn_norm;   // [n_embd] f32, gemma3: RMSNorm of the feed-forward output
  // bert's post-norms are LayerNorms of the residual stream after attention and after the
  // feed-forward (post_attn_norm, post_ffn_norm), with these biases.
  WeightTensor post_attn_norm_b;  // [n_embd] f32, bert only
  WeightTensor post_ffn_norm_b;   // [n_embd] f32, bert only
  WeightTensor ffn_norm;          // [n_embd] f32 (gpt-oss: post_attention_norm, its pre-MoE norm)
  WeightTensor ffn_gate;          // {n_embd, n_ff} (SwiGLU's gate; GeGLU's for gemma3)
  WeightTensor ffn_up;            // {n_embd, n_ff}
  WeightTensor ffn_down;          // {n_ff, n_embd}
  WeightTensor ffn_up_b;          // [n_ff] f32, bert only (its feed-forward is down(gelu(up(h))))
  WeightTensor ffn_down_b;        // [n_embd] f32, bert only
  MoeLayerWeights moe;            // qwen2moe, qwen3moe: the feed-forward instead of ffn_gate/up/down
};

struct ModelWeights {
  WeightTensor token_embd;           // {n_embd, n_vocab}, any dtype get_rows reads
  WeightTensor output_norm;          // [n_embd] f32; absent for encoders
  WeightTensor output;               // {n_embd, n_vocab}: output.weight, or token_embd when tied;
                                     // absent for encoders
  WeightTensor token_types;          // {n_embd, n_token_types} f32, bert only
  WeightTensor position_embd;        // {n_embd, n_ctx_train}, bert only (absolute positions)
  WeightTensor token_embd_norm;      // [n_embd] f32, bert only: LayerNorm of the summed embeddings
  WeightTensor token_embd_norm_b;    // [n_embd] f32, bert only
  bool tied_output = false;          // output.weight was absent
  WeightTensor rope_freqs;           // [n_rot / 2] f32 llama3-style frequency divisors; absent: all 1
  WeightTensor rope_factors_short;   // [n_rot / 2] f32 LongRoPE divisors within n_ctx_orig; with
  WeightTensor rope_factors_long;    // [n_rot / 2] f32 the divisors past it; both or neither
  std::vector<LayerWeights> layers;  // [n_layer]
};

// Binds every tensor the architecture needs, checking names, shapes and dtypes (the latter
// against what `backend` supports). Sets config.n_vocab from token_embd. Throws FormatError
// naming the tensor, with expected and actual shape or type.
ModelWeights bind_weights(const GGUFFile& file, ModelConfig& config, const Backend& backend);

}  // namespace ember
