// model/config.cpp: the table of supported architectures and the GGUF metadata keys of each
// hyper-parameter (as llama.cpp's converter writes them).
#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/moe.h"

namespace ember {

namespace {

constexpr ArchInfo kArchs[] = {
    {"llama", ArchFamily::llama, RopeLayout::interleaved, /*qkv_bias=*/false, /*qk_norm=*/false},
    {"qwen2", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/true, /*qk_norm=*/false},
    {"qwen3", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/false, /*qk_norm=*/true},
    {"phi3", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/false, /*qk_norm=*/false},
    {"gemma3", ArchFamily::gemma3, RopeLayout::neox, /*qkv_bias=*/false, /*qk_norm=*/true},
    {"gemma2", ArchFamily::gemma3, RopeLayout::neox, /*qkv_bias=*/false, /*qk_norm=*/false},
    {"bert", ArchFamily::bert, RopeLayout::neox, /*qkv_bias=*/true, /*qk_norm=*/false},
    {"qwen2moe", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/true, /*qk_norm=*/false},
    {"qwen3moe", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/false, /*qk_norm=*/true},
    {"smollm3", ArchFamily::llama, RopeLayout::interleaved, /*qkv_bias=*/false, /*qk_norm=*/false},
    {"gpt-oss", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/true, /*qk_norm=*/false},
    {"qwen2vl", ArchFamily::llama, RopeLayout::neox, /*qkv_bias=*/true, /*qk_norm=*/false},
};

// Qwen2-VL's M-RoPE: the rotated pairs fall into sections rotated by a token's temporal, height
// and width positions in turn ({arch}.rope.dimension_sections, llama.cpp pads it to 4 entries
// with zeros); a text token's three positions are equal, so text alone rotates as plain RoPE.
void read_mrope_sections(const GGUFFile& file, ModelConfig& c) {
  const std::string key = cat(c.arch->name, ".rope.dimension_sections");
  const std::vector<int64_t> sections = file.get_ints(key);
  int64_t n_pairs = 0;
  for (int64_t s : sections) n_pairs += s;
  const bool fourth_unused = sections.size() == 4 && sections[3] == 0;
  if ((sections.size() != 3 && !fourth_unused) || n_pairs != c.n_rot / 2 ||
      std::any_of(sections.begin(), sections.end(), [](int64_t s) { return s < 0; })) {
    throw FormatError(
        cat("[model] ", file.path(), ": metadata '", key, "' must be three sections (t, h, w; a ",
            "fourth of 0 allowed) of >= 0 pairs summing to rope.dimension_count / 2 = ", c.n_rot / 2,
            ", got ", sections.size(), " entries summing to ", n_pairs));
  }
  for (int i = 0; i < 3; ++i) c.mrope_sections[i] = sections[i];
}

}  // namespace

const ArchInfo* find_arch(std::string_view name) {
  for (const ArchInfo& arch : kArchs) {
    if (name == arch.name) return &arch;
  }
  return nullptr;
}

std::string supported_arch_names() {
  std::string names;
  for (const ArchInfo& arch : kArchs) names += names.empty() ? arch.name : cat(", ", arch.name);
  return names;
}

ModelConfig read_config(const GGUFFile& file) {
  const std::string arch_name = file.get_string("general.architecture");
  if (arch_name.empty()) {
    throw FormatError(cat("[model] ", file.path(), ": metadata 'general.architecture' is missing"));
  }
  ModelConfig c;
  c.arch = find_arch(arch_name);
  if (!c.arch) {
    throw Unsupported(cat("[model] ", file.path(), ": architecture '", arch_name,
                          "' is not supported; supported architectures: ", supported_arch_names()));
  }
  const std::string p = arch_name + ".";
  auto required_int = [&](const std::string& key) {
    const int64_t value = file.get_int(p + key, -1);
    if (value <= 0) {
      throw FormatError(cat("[model] ", file.path(), ": metadata '", p, key, "' is ",
                            value == -1 ? "missing" : cat(value, ", expected > 0")));
    }
    return value;
  };
  c.n_embd = required_int("embedding_length");
  c.n_layer = required_int("block_count");
  c.n_head = required_int("attention.head_count");
  c.n_ff = required_int("feed_forward_length");
  c.n_ctx_train = required_int("context_length");
  c.n_head_kv = file.get_int(p + "attention.head_count_kv", c.n_head);
  c.head_dim = file.get_int(p + "attention.key_length", c.n_embd / c.n_head);
  c.rms_eps = static_cast<float>(file.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  c.n_rot = file.get_int(p + "rope.dimension_count", c.head_dim);
  c.rope_freq_base = static_cast<float>(file.get_float(p + "rope.freq_base", 10000.0));

  const std::string where = cat("[model] ", file.path(), ": ");
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) {
    throw FormatError(cat(where, "attention.head_count ", c.n_head,
                          " is not a multiple of attention.head_count_kv ", c.n_head_kv));
  }
  const int64_t value_length = file.get_int(p + "attention.value_length", c.head_dim);
  if (c.head_dim <= 0 || c.head_dim > kMaxHeadDim || value_length != c.head_dim) {
    throw Unsupported(cat(where, "head dimension ", c.head_dim, " (value length ", value_length,
                          ") is not supported; expected key length == value length <= ", kMaxHeadDim));
  }
  if (c.n_rot <= 0 || c.n_rot % 2 != 0 || c.n_rot > c.head_dim) {
    throw FormatError(cat(where, "rope.dimension_count ", c.n_rot,
                          " must be even and at most the head dimension ", c.head_dim));
  }
  if (!(c.rms_eps > 0.0f)) throw FormatError(cat(where, "attention.layer_norm_rms_epsilon must be > 0"));
  if (!(c.rope_freq_base > 0.0f)) throw FormatError(cat(where, "rope.freq_base must be > 0"));

  // RoPE scaling as llama.cpp reads it: the factor (or the older rope.scale_linear) divides the
  // frequencies for "linear" (and when no type is given); llama3-style scaling is carried by
  // the rope_freqs.weight tensor instead, with no scaling type needed.
  const std::string scaling = file.get_string(p + "rope.scaling.type", "linear");
  if (scaling != "none" && scaling != "linear" && scaling != "yarn") {
    throw Unsupported(cat(where, "rope.scaling.type '", scaling,
                          "' is not supported; supported: none, linear, yarn (and llama3-style "
                          "frequency factors in rope_freqs.weight)"));
  }
  double factor = file.get_float(p + "rope.scaling.factor", 0.0);
  if (factor == 0.0) factor = file.get_float(p + "rope.scale_linear", 0.0);
  if (factor < 0.0) throw FormatError(cat(where, "rope.scaling.factor ", factor, " must be > 0"));
  if (scaling == "linear" && factor > 0.0) c.rope_freq_scale = static_cast<float>(1.0 / factor);
  if (scaling == "yarn" && factor > 1.0) {
    c.rope_yarn = true;
    c.rope_yarn_factor = static_cast<float>(factor);
    c.rope_yarn_beta_fast = static_cast<float>(file.get_float(p + "rope.scaling.yarn_beta_fast", 32.0));
    c.rope_yarn_beta_slow = static_cast<float>(file.get_float(p + "rope.scaling.yarn_beta_slow", 1.0));
    c.rope_yarn_truncate = file.get_bool(p + "rope.scaling.yarn_truncate", true);
    const double ext = file.get_float(p + "rope.scaling.yarn_ext_factor", 1.0);
    const double attn = file.get_float(p + "rope.scaling.yarn_attn_factor", 1.0);
    if (ext != 1.0 || attn != 1.0 || file.get_float(p + "rope.scaling.yarn_log_multiplier", 0.0) != 0.0) {
      throw Unsupported(cat(where, "YaRN with yarn_ext_factor ", ext, ", yarn_attn_factor ", attn,
                            " or a yarn_log_multiplier is not supported; ember runs the plain YaRN ramp"));
    }
    if (!(c.rope_yarn_beta_fast > c.rope_yarn_beta_slow) || !(c.rope_yarn_beta_slow > 0.0f)) {
      throw FormatError(cat(where, "rope.scaling.yarn_beta_fast ", c.rope_yarn_beta_fast,
                            " and yarn_beta_slow ", c.rope_yarn_beta_slow, " must satisfy fast > slow > 0"));
    }
  }

  // As llama.cpp reads them for every architecture: the context the RoPE was trained for (which
  // picks LongRoPE's factors) and a factor on every rotated value (LongRoPE's attention scaling).
  c.n_ctx_orig = file.get_int(p + "rope.scaling.original_context_length", c.n_ctx_train);
  c.rope_attn_factor = static_cast<float>(file.get_float(p + "rope.scaling.attn_factor", 1.0));
  // YaRN's magnitude scaling of cos and sin (transformers' get_mscale, ggml's rope_yarn).
  if (c.rope_yarn) c.rope_attn_factor *= 1.0f + 0.1f * std::log(c.rope_yarn_factor);
  if (c.n_ctx_orig <= 0 || !(c.rope_attn_factor > 0.0f)) {
    throw FormatError(cat(where, "rope.scaling.original_context_length ", c.n_ctx_orig, " and attn_factor ",
                          c.rope_attn_factor, " must be > 0"));
  }
  if (arch_name == "smollm3") {
    // Which layers rotate: the file's pattern (llama.cpp's key, which its smollm3 code does not
    // read), else llama.cpp's and transformers' default, every 4th layer without RoPE.
    const std::vector<int64_t> pattern = file.get_ints(p + "attention.rope_pattern");
    if (!pattern.empty() && static_cast<int64_t>(pattern.size()) != c.n_layer) {
      throw FormatError(cat(where, "attention.rope_pattern has ", pattern.size(),
                            " entries, expected one per layer (", c.n_layer, ")"));
    }
    for (int64_t il = 0; il < c.n_layer; ++il) {
      const bool rotates = pattern.empty() ? (il + 1) % 4 != 0 : pattern[il] != 0;
      c.rope_layers.push_back(rotates ? 1 : 0);
    }
  }

  if (arch_name == "qwen2vl") read_mrope_sections(file, c);

  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.arch->family == ArchFamily::llama) {
    // Mistral's window covers every layer (llama.cpp's own llama code ignores this key); gpt-oss
    // windows every other layer, from the first (llama.cpp's default pattern for it).
    c.sliding_window = file.get_int(p + "attention.sliding_window", 0);
    if (arch_name == "gpt-oss") c.swa_pattern = file.get_int(p + "attention.sliding_window_pattern", 2);
    if (c.sliding_window < 0 || c.swa_pattern < 0) {
      throw FormatError(cat(where, "attention.sliding_window ", c.sliding_window,
                            " and sliding_window_pattern ", c.swa_pattern, " must be >= 0"));
    }
  }
  if (c.arch->family == ArchFamily::gemma3) {
    // As llama.cpp reads them: gemma2 defaults to a 4096 window on every other layer, its local
    // layers on the global base; gemma3 to every 6th layer global, local base 10000.
    const bool gemma2 = arch_name == "gemma2";
    c.sliding_window = file.get_int(p + "attention.sliding_window", gemma2 ? 4096 : 0);
    c.swa_pattern = file.get_int(p + "attention.sliding_window_pattern", gemma2 ? 2 : 6);
    c.swa_own_rope = true;
    c.rope_freq_base_swa = static_cast<float>(
        file.get_float(p + "rope.freq_base_swa", gemma2 ? c.rope_freq_base : 10000.0));
    if (c.sliding_window < 0 || c.swa_pattern <= 0 || !(c.rope_freq_base_swa > 0.0f)) {
      throw FormatError(cat(where, "attention.sliding_window ", c.sliding_window, ", sliding_window_pattern ",
                            c.swa_pattern, " and rope.freq_base_swa ", c.rope_freq_base_swa,
                            " must be >= 0, > 0 and > 0"));
    }
    c.attn_softcap = static_cast<float>(file.get_float(p + "attn_logit_softcapping", 0.0));
    c.final_softcap = static_cast<float>(file.get_float(p + "final_logit_softcapping", 0.0));
    if (c.attn_softcap < 0.0f || c.final_softcap < 0.0f) {
      throw FormatError(cat(where, "attn_logit_softcapping ", c.attn_softcap, " and final_logit_softcapping ",
                            c.final_softcap, " must be >= 0"));
    }
    // Gemma scales queries by query_pre_attn_scalar^-1/2, which GGUF does not store: it is
    // head_dim, except for the 27B models (gemma2: 46 layers, gemma3: 62), where it is
    // n_embd / n_head (as llama.cpp and gemma_pytorch's config set it).
    const int64_t scalar = c.n_layer == (gemma2 ? 46 : 62) ? c.n_embd / c.n_head : c.head_dim;
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
  }
  read_moe_config(file, c);
  if (c.is_encoder()) {
    c.layer_norm_eps = static_cast<float>(file.get_float(p + "attention.layer_norm_epsilon", 1e-12));
    if (!(c.layer_norm_eps > 0.0f)) throw FormatError(cat(where, "attention.layer_norm_epsilon must be > 0"));
    if (file.get_bool(p + "attention.causal", false)) {
      throw Unsupported(cat(where, "attention.causal is true; ember runs ", arch_name,
                            " with bidirectional attention only"));
    }
    c.n_token_types = file.get_int("tokenizer.ggml.token_type_count", 0);
  }
  // As llama.cpp: a file that does not say pools an encoder's states by mean, a decoder's not at all.
  const Pooling unsaid = c.is_encoder() ? Pooling::mean : Pooling::none;
  const int64_t pooling = file.get_int(p + "pooling_type", static_cast<int64_t>(unsaid));
  if (pooling < static_cast<int64_t>(Pooling::none) || pooling > static_cast<int64_t>(Pooling::rank)) {
    throw Unsupported(cat(where, "pooling_type ", pooling,
                          " is not supported; supported: 0 (none), 1 (mean), 2 (cls), 3 (last), 4 (rank)"));
  }
  c.pooling = static_cast<Pooling>(pooling);
  return c;
}

}  // namespace ember
