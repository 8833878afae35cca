// model/moe.cpp: the mixture-of-experts architectures' (qwen2moe, qwen3moe, gpt-oss) routing facts and GGUF
// keys (as llama.cpp's converter writes them), and the routed feed-forward: route, group rows by expert, one
// matmul per chosen expert over its rows, scatter-add the weighted outputs.
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/error.h"

namespace ember {

namespace {

// What llama.cpp fixes per architecture (llama-model.cpp's build_moe_ffn arguments).
struct MoeArch {
  const char* name;
  bool weights_norm;   // top-k weights renormalised (qwen3moe) or the softmax's as they are (qwen2moe)
  bool shared_expert;  // a sigmoid-gated shared expert beside the routed ones
  bool oai;            // gpt-oss: biased router and experts, the clamped SwiGLU
};

constexpr MoeArch kMoeArchs[] = {
    {"qwen2moe", /*weights_norm=*/false, /*shared_expert=*/true, /*oai=*/false},
    {"qwen3moe", /*weights_norm=*/true, /*shared_expert=*/false, /*oai=*/false},
    // gpt-oss's softmax over the top k logits is the renormalised top k of the full softmax.
    {"gpt-oss", /*weights_norm=*/true, /*shared_expert=*/false, /*oai=*/true},
};

// gpt-oss's SwiGLU constants (transformers' swiglu_alpha and swiglu_limit; llama.cpp's
// LLM_FFN_SWIGLU_OAI_MOE fixes the same values, and the converter refuses others).
constexpr float kOaiSwigluAlpha = 1.702f, kOaiSwigluLimit = 7.0f;

// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (expert_gating_func).
constexpr int64_t kGatingSoftmax = 1;

// The largest row count any weight type's matmul needs to be batch-invariant on `backend`.
int64_t max_exact_min_rows(const Backend& backend) {
  int64_t n = 1;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* t = find_type_traits(id);
    if (t && backend.supports(Op::matmul, t->type)) n = std::max(n, backend.matmul_exact_min_rows(t->type));
  }
  return n;
}

}  // namespace

void read_moe_config(const GGUFFile& file, ModelConfig& c) {
  const std::string p = cat(c.arch->name, ".");
  const std::string where = cat("[model] ", file.path(), ": ");
  const MoeArch* arch = nullptr;
  for (const MoeArch& a : kMoeArchs) {
    if (std::string_view(c.arch->name) == a.name) arch = &a;
  }
  if (!arch) {
    if (file.get_int(p + "expert_count", 0) > 0) {
      throw Unsupported(
          cat(where, "'", c.arch->name, "' with experts (", p,
              "expert_count > 0) is not supported; mixture-of-experts architectures: qwen2moe, qwen3moe, "
              "gpt-oss"));
    }
    return;
  }
  c.n_expert = file.get_int(p + "expert_count", 0);
  c.n_expert_used = file.get_int(p + "expert_used_count", 0);
  if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert) {
    throw FormatError(cat(where, "metadata '", p, "expert_count' (", c.n_expert, ") and '", p,
                          "expert_used_count' (", c.n_expert_used, ") must satisfy 0 < used <= count"));
  }
  // llama.cpp's fallbacks when the widths are not written.
  c.n_ff_exp = file.get_int(p + "expert_feed_forward_length", c.n_ff / c.n_expert_used);
  c.n_ff_shexp = arch->shared_expert ? file.get_int(p + "expert_shared_feed_forward_length", c.n_ff) : 0;
  if (c.n_ff_exp <= 0 || c.n_ff_shexp < 0) {
    throw FormatError(
        cat(where, "metadata '", p, "expert_feed_forward_length' (", c.n_ff_exp, ") must be > 0"));
  }
  c.expert_weights_norm = file.get_bool(p + "expert_weights_norm", arch->weights_norm);
  if (arch->oai) {
    c.expert_bias = true;
    c.swiglu_alpha = kOaiSwigluAlpha;
    c.swiglu_limit = kOaiSwigluLimit;
  }
  const int64_t gating = file.get_int(p + "expert_gating_func", kGatingSoftmax);
  const double weights_scale = file.get_float(p + "expert_weights_scale", 0.0);
  if (gating != kGatingSoftmax || (weights_scale != 0.0 && weights_scale != 1.0)) {
    throw Unsupported(cat(where, "expert_gating_func ", gating, " with expert_weights_scale ", weights_scale,
                          " is not supported; ember routes by softmax (1) with unscaled weights"));
  }
}

MoeScratch::MoeScratch(Backend& backend, const ModelConfig& c, int64_t n_batch)
    : n_rows(std::max(n_batch, max_exact_min_rows(backend))) {
  const int64_t n_ff = std::max(c.n_ff_exp, c.n_ff_shexp), n_choices = n_batch * c.n_expert_used;
  auto floats = [&](int64_t rows, int64_t n_cols) { return backend.alloc(sizeof(float) * rows * n_cols); };
  probs = floats(n_batch, c.n_expert);
  x = floats(n_rows, c.n_embd);
  gate = floats(n_rows, n_ff);
  up = floats(n_rows, n_ff);
  out = floats(n_rows, c.n_embd);
  shared_logit = floats(n_batch, 1);
  host_probs.resize(n_batch * c.n_expert);
  choice.resize(n_choices);
  choice_weight.resize(n_choices);
  expert_begin.resize(c.n_expert + 1);
  rows.resize(n_choices);
  weights.resize(n_choices);
  ids.resize(n_rows);
  shared_weight.resize(n_batch);
  all_rows.resize(n_batch);
  for (int64_t r = 0; r < n_batch; ++r) all_rows[r] = static_cast<int32_t>(r);
  backend.reserve_matmul(n_rows, std::max(c.n_embd, n_ff));
}

namespace {

// s.choice / s.choice_weight of each row from its router probabilities s.host_probs: the top k
// (ties to the lower expert index), weights renormalised to sum 1 when `norm`.
void route_rows(MoeScratch& s, int64_t n_rows, int64_t n_expert, int64_t k, bool norm) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* p = s.host_probs.data() + r * n_expert;
    int32_t* chosen = s.choice.data() + r * k;
    float* w = s.choice_weight.data() + r * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < n_expert; ++e) {
        if (std::find(chosen, chosen + j, e) != chosen + j) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      chosen[j] = best;
      w[j] = p[best];
      sum += p[best];
    }
    if (norm) {
      for (int64_t j = 0; j < k; ++j) w[j] /= sum;
    }
  }
}

// s.rows / s.weights grouped by expert (rows ascending within each), s.expert_begin their offsets.
void group_by_expert(MoeScratch& s, int64_t n_rows, int64_t n_expert, int64_t k) {
  std::fill(s.expert_begin.begin(), s.expert_begin.end(), 0);
  for (int64_t i = 0; i < n_rows * k; ++i) ++s.expert_begin[s.choice[i] + 1];
  for (int64_t e = 0; e < n_expert; ++e) s.expert_begin[e + 1] += s.expert_begin[e];
  // expert_begin[e] walks forward while filling; afterwards it holds the end of e, the begin of e + 1.
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t slot = s.expert_begin[s.choice[r * k + j]]++;
      s.rows[slot] = static_cast<int32_t>(r);
      s.weights[slot] = s.choice_weight[r * k + j];
    }
  }
  for (int64_t e = n_expert; e > 0; --e) s.expert_begin[e] = s.expert_begin[e - 1];
  s.expert_begin[0] = 0;
}

// The biases of one expert's projections (gpt-oss); nullptr: none.
struct ExpertBias {
  const float* gate = nullptr;  // [n_ff]
  const float* up = nullptr;    // [n_ff]
  const float* down = nullptr;  // [n_embd]
};

// out[n, n_embd] = down(act(gate(in)) * up(in)) for in [n, n_in = n_embd], each projection plus
// its bias where it has one; act is silu, or gpt-oss's clamped SwiGLU (c.swiglu_limit > 0).
void swiglu(Backend& be, const ModelConfig& c, const WeightTensor& gate, const WeightTensor& up,
            const WeightTensor& down, const ExpertBias& bias, int64_t n_ff, MoeScratch& s, const float* in,
            int64_t n, float* out) {
  const int64_t n_embd = c.n_embd;
  float* g = s.gate.as<float>();
  float* u = s.up.as<float>();
  const MatmulOut gate_up[] = {{gate.type, gate.data, n_ff, g}, {up.type, up.data, n_ff, u}};
  be.matmul_many(gate_up, 2, n_embd, in, n);
  if (bias.gate) be.add_bias(g, bias.gate, n, n_ff);
  if (bias.up) be.add_bias(u, bias.up, n, n_ff);
  if (c.swiglu_limit > 0.0f) {
    be.swiglu_oai(g, u, n * n_ff, c.swiglu_alpha, c.swiglu_limit, g);
  } else {
    be.silu_mul(g, u, n * n_ff, g);
  }
  be.matmul(down.type, down.data, n_ff, n_embd, g, n, out);
  if (bias.down) be.add_bias(out, bias.down, n, n_embd);
}

}  // namespace

void moe_feed_forward(Backend& be, const ModelConfig& c, const MoeLayerWeights& m, MoeScratch& s,
                      const float* xn, int64_t n, float* x) {
  const int64_t n_embd = c.n_embd, n_expert = c.n_expert, k = c.n_expert_used;
  float* out = s.out.as<float>();  // [rows, n_embd]

  // --- routing: softmax of the router logits, top k per row, rows grouped by expert ---
  be.matmul(m.router.type, m.router.data, n_embd, n_expert, xn, n, s.probs.as<float>());
  if (m.router_b) be.add_bias(s.probs.as<float>(), m.router_b.f32(), n, n_expert);
  be.softmax(s.probs.as<float>(), n, n_expert);
  be.download(s.probs, 0, s.host_probs.data(), sizeof(float) * static_cast<size_t>(n * n_expert));
  route_rows(s, n, n_expert, k, c.expert_weights_norm);
  group_by_expert(s, n, n_expert, k);

  // --- each chosen expert over its rows: x[row] += weight * expert(xn[row]) ---
  for (int64_t e = 0; e < n_expert; ++e) {
    const int32_t begin = s.expert_begin[e], n_e = s.expert_begin[e + 1] - begin;
    if (n_e == 0) continue;  // its weights are never read
    const WeightTensor &gate = m.gate[e], &up = m.up[e], &down = m.down[e];
    // Padding rows (copies of the first) lift the call to where its rows' bits no longer depend
    // on the call's row count; their outputs are dropped.
    const int64_t n_call = std::max<int64_t>({n_e, be.matmul_exact_min_rows(gate.type),
                                              be.matmul_exact_min_rows(up.type),
                                              be.matmul_exact_min_rows(down.type)});
    std::copy(s.rows.begin() + begin, s.rows.begin() + begin + n_e, s.ids.begin());
    std::fill(s.ids.begin() + n_e, s.ids.begin() + n_call, s.rows[begin]);
    be.get_rows(DType::f32, xn, n_embd, s.ids.data(), n_call, s.x.as<float>());
    ExpertBias bias;
    if (m.gate_b) {
      bias = {m.gate_b.f32() + e * c.n_ff_exp, m.up_b.f32() + e * c.n_ff_exp, m.down_b.f32() + e * n_embd};
    }
    swiglu(be, c, gate, up, down, bias, c.n_ff_exp, s, s.x.as<float>(), n_call, out);
    be.add_rows_scaled(out, s.ids.data(), s.weights.data() + begin, n_e, n_embd, x);
  }

  // --- the shared expert: x += sigmoid(shared_gate_inp · xn) * shared(xn) ---
  if (!m.shared_gate) return;
  be.matmul(m.shared_gate_inp.type, m.shared_gate_inp.data, n_embd, 1, xn, n, s.shared_logit.as<float>());
  swiglu(be, c, m.shared_gate, m.shared_up, m.shared_down, ExpertBias{}, c.n_ff_shexp, s, xn, n, out);
  be.download(s.shared_logit, 0, s.shared_weight.data(), sizeof(float) * static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) s.shared_weight[r] = 1.0f / (1.0f + std::exp(-s.shared_weight[r]));
  be.add_rows_scaled(out, s.all_rows.data(), s.shared_weight.data(), n, n_embd, x);
}

}  // namespace ember
