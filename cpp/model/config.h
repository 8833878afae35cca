// model/config.h: a model's hyper-parameters, read from GGUF metadata and checked for sense.
// Knows the supported architectures and their differences; nothing about weights or run state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"
#include "gguf/gguf.h"

namespace ember {

// The forward pass an architecture runs: one file per family (model/llama.cpp, model/gemma3.cpp,
// model/bert.cpp; smollm3 is llama with NoPE layers, gpt-oss llama with attention sinks and biased experts).
// gemma3's pass also runs gemma2 (the same blocks without Q/K norms, with logit soft-capping). bert is an
// encoder: it computes embeddings (model/embedder.h), never logits.
enum class ArchFamily { llama, gemma3, bert };

// How a sequence's final token states become one embedding ({arch}.pooling_type, llama.cpp's
// values): none keeps every token's state; rank is the state a classification head reads (a
// reranker's): the first token's in an encoder, the last one's in a decoder.
enum class Pooling { none = 0, mean = 1, cls = 2, last = 3, rank = 4 };

// What distinguishes the supported architectures.
struct ArchInfo {
  const char* name;  // general.architecture
  ArchFamily family;
  RopeLayout rope_layout;  // llama: interleaved (GGUF Q/K rows are permuted for it); qwen, gemma: neox
  bool qkv_bias;           // qwen2: biases on the Q, K and V projections
  bool qk_norm;            // qwen3, gemma3: RMSNorm of every Q and K head before RoPE
};

// The ArchInfo of an architecture name; nullptr when unsupported.
const ArchInfo* find_arch(std::string_view name);
// "llama, qwen2, qwen3", for error messages.
std::string supported_arch_names();

struct ModelConfig {
  const ArchInfo* arch = nullptr;
  int64_t n_vocab = 0;  // rows of token_embd
  int64_t n_embd = 0;   // width of the residual stream
  int64_t n_layer = 0;
  int64_t n_head = 0;       // query heads
  int64_t n_head_kv = 0;    // key/value heads (grouped-query attention when < n_head)
  int64_t head_dim = 0;     // {arch}.attention.key_length, else n_embd / n_head
  int64_t n_ff = 0;         // hidden width of the SwiGLU feed-forward
  int64_t n_ctx_train = 0;  // {arch}.context_length
  float rms_eps = 1e-5f;

  // RoPE: theta_i(pos) = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factor_i, where the
  // llama3-style factors come from the rope_freqs.weight tensor (see ModelWeights).
  int64_t n_rot = 0;  // rotated dims per head, {arch}.rope.dimension_count, else head_dim
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor (linear scaling)
  // LongRoPE (Phi-3 / Phi-4 long-context models): two sets of frequency divisors,
  // rope_factors_short.weight and rope_factors_long.weight (see ModelWeights); a context that
  // may reach past n_ctx_orig uses the long ones (Model::rope_params).
  int64_t n_ctx_orig = 0;         // {arch}.rope.scaling.original_context_length, else n_ctx_train
  float rope_attn_factor = 1.0f;  // {arch}.rope.scaling.attn_factor: multiplies cos and sin
  // YaRN ({arch}.rope.scaling.type yarn): the frequencies i between the correction dims of
  // beta_fast and beta_slow rotations over n_ctx_orig ramp from unscaled (fast) to divided by
  // rope_yarn_factor (slow), as transformers' _compute_yarn_parameters; rope_attn_factor then
  // also holds YaRN's 1 + 0.1 ln(factor). The correction dims are floored and ceiled unless
  // rope.scaling.yarn_truncate is false (ember's key: transformers' truncate, which gpt-oss turns
  // off; llama.cpp always truncates).
  bool rope_yarn = false;
  float rope_yarn_factor = 1.0f;      // {arch}.rope.scaling.factor
  float rope_yarn_beta_fast = 32.0f;  // {arch}.rope.scaling.yarn_beta_fast
  float rope_yarn_beta_slow = 1.0f;   // {arch}.rope.scaling.yarn_beta_slow
  bool rope_yarn_truncate = true;     // {arch}.rope.scaling.yarn_truncate
  // M-RoPE (qwen2vl): pairs [0, s0) rotate by a token's temporal position, [s0, s0 + s1) by its
  // height, the rest by its width (all {0, 0, 0}: plain RoPE). Text tokens' three positions are
  // equal, so only image tokens (model/mrope.h) rotate differently.
  int64_t mrope_sections[3] = {0, 0, 0};  // {arch}.rope.dimension_sections
  // NoPE layers (SmolLM3): layer il rotates Q and K unless rope_layers[il] is 0.
  std::vector<uint8_t> rope_layers;  // [n_layer] {arch}.attention.rope_pattern; empty: all rotate

  // Sliding-window attention: layer il is local, seeing only the last sliding_window positions,
  // unless swa_pattern > 0 and (il + 1) % swa_pattern == 0 (gemma2, gemma3: every n-th layer
  // global; llama with a window, i.e. Mistral: swa_pattern 0, every layer local). Gemma's local
  // layers rotate with their own base and no scaling. sliding_window 0: every layer is global.
  int64_t sliding_window = 0;           // {arch}.attention.sliding_window
  int64_t swa_pattern = 0;              // {arch}.attention.sliding_window_pattern; gemma2 2, gemma3 6
  bool swa_own_rope = false;            // gemma: local layers rotate with rope_freq_base_swa
  float rope_freq_base_swa = 10000.0f;  // {arch}.rope.freq_base_swa
  float attention_scale = 0.0f;         // q·k scale; 1/sqrt(head_dim) unless the architecture says
  // Logit soft-capping (gemma2): x -> cap * tanh(x / cap) of the attention scores (after the
  // scale) and of the output logits; 0: none.
  float attn_softcap = 0.0f;   // {arch}.attn_logit_softcapping
  float final_softcap = 0.0f;  // {arch}.final_logit_softcapping

  // The pooling of token states into embeddings (model/embedder.h), any architecture.
  Pooling pooling = Pooling::none;  // {arch}.pooling_type; unsaid: an encoder mean, a decoder none

  // Encoders (bert): LayerNorm epsilon, token type count.
  float layer_norm_eps = 1e-12f;  // {arch}.attention.layer_norm_epsilon
  int64_t n_token_types = 0;      // tokenizer.ggml.token_type_count, else token_types.weight's rows

  // Mixture of experts (qwen2moe, qwen3moe; model/moe.h): with n_expert > 0 every layer's
  // feed-forward routes each token to n_expert_used of n_expert SwiGLU experts.
  int64_t n_expert = 0;              // {arch}.expert_count
  int64_t n_expert_used = 0;         // {arch}.expert_used_count (top-k)
  int64_t n_ff_exp = 0;              // {arch}.expert_feed_forward_length: hidden width of one expert
  int64_t n_ff_shexp = 0;            // {arch}.expert_shared_feed_forward_length; 0: no shared expert
  bool expert_weights_norm = false;  // top-k weights renormalised to sum 1 ({arch}.expert_weights_norm)
  // gpt-oss: biases on the router and on every expert's gate, up and down projections, and the
  // experts' clamped SwiGLU (Backend::swiglu_oai) with these constants (llama.cpp fixes them too).
  bool expert_bias = false;
  float swiglu_alpha = 0.0f;
  float swiglu_limit = 0.0f;  // > 0: the clamped SwiGLU; 0: silu(gate) * up

  bool is_moe() const { return n_expert > 0; }
  bool is_mrope() const { return mrope_sections[0] + mrope_sections[1] + mrope_sections[2] > 0; }
  bool uses_rope(int64_t il) const { return rope_layers.empty() || rope_layers[il] != 0; }
  bool is_encoder() const { return arch->family == ArchFamily::bert; }
  bool is_swa(int64_t il) const {
    return sliding_window > 0 && (swa_pattern == 0 || (il + 1) % swa_pattern != 0);
  }

  int64_t n_q_dim() const { return n_head * head_dim; }      // width of Q and of attention output
  int64_t n_kv_dim() const { return n_head_kv * head_dim; }  // width of one K (or V) cache row
};

// Reads and validates the hyper-parameters. Throws Unsupported for an unknown architecture or
// RoPE scaling type, FormatError for missing or inconsistent values (naming the key).
ModelConfig read_config(const GGUFFile& file);

}  // namespace ember
