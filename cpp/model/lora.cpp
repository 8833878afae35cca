// model/lora.cpp: reading LoRA GGUF files against a model, grouping a pass's rows by adapter,
// and the grouped low-rank product (see lora.h).
#include "model/lora.h"

#include <algorithm>
#include <bit>
#include <string_view>

#include "core/error.h"
#include "kv/block_hash.h"
#include "model/run_state.h"
#include "quant/blocks.h"

namespace ember {
namespace {

// llama.cpp's names of the projections, "blk.N.<name>.weight".
constexpr std::array<std::string_view, kLoraTargets> kTargetNames = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

const WeightTensor& base_weight(const LayerWeights& l, LoraTarget t) {
  switch (t) {
    case LoraTarget::q: return l.wq;
    case LoraTarget::k: return l.wk;
    case LoraTarget::v: return l.wv;
    case LoraTarget::o: return l.wo;
    case LoraTarget::gate: return l.ffn_gate;
    case LoraTarget::up: return l.ffn_up;
    case LoraTarget::down: return l.ffn_down;
  }
  return l.wq;
}

// "blk.N.attn_q.weight" -> (N, q); false for a name of no projection an adapter may change.
bool parse_base_name(std::string_view name, int64_t& il, LoraTarget& target) {
  constexpr std::string_view prefix = "blk.", suffix = ".weight";
  if (!name.starts_with(prefix) || !name.ends_with(suffix)) return false;
  name.remove_prefix(prefix.size());
  name.remove_suffix(suffix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  il = 0;
  for (char ch : name.substr(0, dot)) {
    if (ch < '0' || ch > '9' || il > (int64_t{1} << 20)) return false;
    il = il * 10 + (ch - '0');
  }
  const std::string_view proj = name.substr(dot + 1);
  for (int i = 0; i < kLoraTargets; ++i) {
    if (proj == kTargetNames[static_cast<size_t>(i)]) {
      target = static_cast<LoraTarget>(i);
      return true;
    }
  }
  return false;
}

std::vector<float> read_f32(const GGUFTensorInfo& info, const std::string& where) {
  if (info.type != DType::f32 && info.type != DType::f16) {
    throw FormatError(cat(where, "type ", dtype_name(info.type), "; LoRA tensors must be f32 or f16"));
  }
  int64_t n = 1;
  for (int64_t d : info.shape) n *= d;
  std::vector<float> values(static_cast<size_t>(n));
  type_traits(info.type).dequantize_row(info.data, values.data(), n);
  return values;
}

}  // namespace

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const std::string& path,
                                                     std::shared_ptr<const Model> model) {
  if (!model) throw InvalidArgument("[lora] no model to load an adapter for");
  const std::shared_ptr<GGUFFile> file = GGUFFile::open(path);
  const std::string at = cat("[lora] ", path, ": ");
  const std::string type = file->get_string("general.type");
  if (type != "adapter") {
    throw FormatError(cat(at, "general.type is '", type,
                          "', expected 'adapter' (a LoRA GGUF, as `ember convert "
                          "--lora` or llama.cpp's convert_lora_to_gguf.py write)"));
  }
  const std::string adapter_type = file->get_string("adapter.type");
  if (adapter_type != "lora") {
    throw Unsupported(cat(at, "adapter.type is '", adapter_type, "'; only 'lora' adapters are supported"));
  }
  const ModelConfig& c = model->config();
  const std::string arch = file->get_string("general.architecture");
  if (arch != c.arch->name) {
    throw FormatError(cat(at, "general.architecture is '", arch, "', the model's is '", c.arch->name, "'"));
  }
  Backend& be = model->backend();
  for (Op op : {Op::matmul, Op::get_rows, Op::add_rows_scaled}) {
    if (!be.supports(op, DType::f32)) {
      throw Unsupported(cat(at, "the ", be.name(), " backend has no f32 ", op_name(op),
                            ", which LoRA adapters need; run on the CPU (--device cpu)"));
    }
  }

  auto adapter = std::shared_ptr<LoraAdapter>(new LoraAdapter());
  adapter->path_ = path;
  adapter->alpha_ = static_cast<float>(file->get_float("adapter.lora.alpha", 0.0));
  adapter->model_ = model;
  adapter->layers_.resize(static_cast<size_t>(c.n_layer));
  const ModelWeights& w = model->weights();

  for (const GGUFTensorInfo& a_info : file->tensors()) {
    const std::string& name = a_info.name;
    const std::string where = cat(at, "tensor '", name, "': ");
    const bool is_a = name.ends_with(".lora_a"), is_b = name.ends_with(".lora_b");
    if (!is_a && !is_b) {
      throw Unsupported(cat(where, "not a .lora_a / .lora_b tensor; such adapters are not supported"));
    }
    if (!is_a) continue;  // each pair is read from its A
    const std::string base = name.substr(0, name.size() - 7);
    int64_t il = 0;
    LoraTarget target{};
    if (!parse_base_name(base, il, target) || il >= c.n_layer) {
      throw Unsupported(cat(where, "'", base, "' is not a projection ember adapts (blk.N.attn_q/k/v/output, ",
                            "ffn_gate/up/down of its ", c.n_layer, " layers)"));
    }
    const WeightTensor& wt = base_weight(w.layers[static_cast<size_t>(il)], target);
    if (!wt) throw FormatError(cat(where, "the model has no '", base, "' (a mixture-of-experts layer?)"));
    const GGUFTensorInfo* b_info = file->find_tensor(base + ".lora_b");
    if (!b_info) throw FormatError(cat(where, "its pair '", base, ".lora_b' is missing"));
    const int64_t n_in = wt.ne0, n_out = wt.ne1;
    if (a_info.shape.size() != 2 || b_info->shape.size() != 2 || a_info.shape[0] != n_in ||
        b_info->shape[1] != n_out || a_info.shape[1] != b_info->shape[0] || a_info.shape[1] < 1) {
      throw FormatError(cat(where, "lora_a has shape [", a_info.shape.size() > 0 ? a_info.shape[0] : 0, ", ",
                            a_info.shape.size() > 1 ? a_info.shape[1] : 0, "] and lora_b [",
                            b_info->shape.size() > 0 ? b_info->shape[0] : 0, ", ",
                            b_info->shape.size() > 1 ? b_info->shape[1] : 0, "]; '", base, "' {", n_in, ", ",
                            n_out, "} needs [", n_in, ", rank] and [rank, ", n_out, "]"));
    }
    const int64_t rank = a_info.shape[1];
    std::vector<float> a = read_f32(a_info, where);
    std::vector<float> b = read_f32(*b_info, cat(at, "tensor '", base, ".lora_b': "));
    // llama.cpp's scale: alpha / rank, where alpha is given (else 1), on top of the request's.
    const float factor = adapter->alpha_ != 0.0f ? adapter->alpha_ / static_cast<float>(rank) : 1.0f;
    for (float& v : b) v *= factor;

    LoraWeight& lw = adapter->layers_[static_cast<size_t>(il)][static_cast<size_t>(target)];
    if (lw) throw FormatError(cat(where, "'", base, "' has two adapter pairs"));
    lw.rank = rank;
    // An f16 pair stays f16 (half the bytes each step reads: four adapters' A and B in f32 are
    // 200 MB a step of a 1.1B model, more than a third of its weights); B then holds the f16 of
    // its values times alpha / rank, rounded once more where that factor is no power of two.
    const bool f16 = a_info.type == DType::f16 && b_info->type == DType::f16 &&
                     be.supports(Op::matmul, DType::f16);
    const DType type = f16 ? DType::f16 : DType::f32;
    const void* a_data = a.data();
    const void* b_data = b.data();
    if (f16) {
      std::vector<uint16_t> a16(a.size()), b16(b.size());
      std::transform(a.begin(), a.end(), a16.begin(), f32_to_f16);
      std::transform(b.begin(), b.end(), b16.begin(), f32_to_f16);
      a_data = adapter->host_f16_.emplace_back(std::move(a16)).data();
      b_data = adapter->host_f16_.emplace_back(std::move(b16)).data();
    }
    Buffer pa = be.prepare_matmul_weight(type, a_data, n_in, rank);
    Buffer pb = be.prepare_matmul_weight(type, b_data, rank, n_out);
    lw.a = WeightTensor{type, pa.data(), n_in, rank};
    lw.b = WeightTensor{type, pb.data(), rank, n_out};
    adapter->prepared_.push_back(std::move(pa));
    adapter->prepared_.push_back(std::move(pb));
    adapter->host_.push_back(std::move(a));  // a prepared weight may be a view of these
    adapter->host_.push_back(std::move(b));
    adapter->max_rank_ = std::max(adapter->max_rank_, rank);
    ++adapter->n_weights_;
  }
  for (const GGUFTensorInfo& info : file->tensors()) {
    if (info.name.ends_with(".lora_b") &&
        !file->find_tensor(info.name.substr(0, info.name.size() - 7) + ".lora_a")) {
      throw FormatError(cat(at, "tensor '", info.name, "': its pair '",
                            info.name.substr(0, info.name.size() - 7), ".lora_a' is missing"));
    }
  }
  if (adapter->n_weights_ == 0) throw FormatError(cat(at, "no LoRA tensors"));
  const int32_t alpha_bits = std::bit_cast<int32_t>(adapter->alpha_);
  BlockHash identity = hash_block(kRootBlockHash, {&alpha_bits, 1});
  for (const std::vector<float>& values : adapter->host_) {
    identity = hash_block(identity, {reinterpret_cast<const int32_t*>(values.data()), values.size()});
  }
  adapter->identity_ = identity;
  return adapter;
}

void LoraRows::reserve(int64_t n_batch) {
  groups.reserve(static_cast<size_t>(n_batch));
  ids.reserve(static_cast<size_t>(n_batch));
  scales.reserve(static_cast<size_t>(n_batch));
}

void LoraRows::build(const ForwardBatch& batch, const int32_t* row_of, int64_t n_rows, bool one_row_groups) {
  groups.clear();
  ids.clear();
  scales.clear();
  if (batch.n_adapters == 0) return;
  // Rows of a sequence are contiguous and sequences ascend, so a walk over them in step with the
  // (ascending) rows finds each row's sequence.
  for (int32_t adapter = 0; adapter < batch.n_adapters; ++adapter) {
    const int64_t begin = static_cast<int64_t>(ids.size());
    int64_t is = 0;
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t row = row_of ? row_of[i] : i;
      while (batch.seqs[is].row_begin + batch.seqs[is].n_rows <= row) ++is;
      const SequenceRows& seq = batch.seqs[is];
      if (seq.lora != adapter) continue;
      if (one_row_groups) groups.push_back({adapter, static_cast<int64_t>(ids.size()), 1, true});
      ids.push_back(static_cast<int32_t>(i));
      scales.push_back(seq.lora_scale);
    }
    const int64_t n = static_cast<int64_t>(ids.size()) - begin;
    if (one_row_groups || n == 0) continue;
    const bool contiguous = ids.back() - ids[static_cast<size_t>(begin)] == n - 1;
    groups.push_back({adapter, begin, n, contiguous});
  }
}

LoraScratch::LoraScratch(Backend& backend, const ModelConfig& c, int64_t n_batch, int64_t max_rank_)
    : max_rank(max_rank_) {
  auto floats = [&](int64_t n_cols) { return backend.alloc(sizeof(float) * n_batch * n_cols); };
  x = floats(std::max({c.n_embd, c.n_q_dim(), c.n_ff}));
  t = floats(kMaxLowRankOuts * max_rank);
  y = floats(std::max({c.n_embd, c.n_q_dim(), c.n_kv_dim(), c.n_ff}));
  all_rows.reserve(n_batch);
  output_rows.reserve(n_batch);
  groups.reserve(static_cast<size_t>(n_batch));
}

void add_lora(Backend& be, const ForwardBatch& batch, LoraScratch& s, const LoraRows& rows, int64_t il,
              const LoraOut* outs, int n_outs, const float* x, int64_t n_in) {
  s.groups.clear();
  for (const LoraRows::Group& g : rows.groups) {
    const LoraAdapter& adapter = *batch.adapters[g.adapter];
    LowRankGroup& lg = s.groups.emplace_back();
    lg.rows = rows.ids.data() + g.begin;
    lg.scales = rows.scales.data() + g.begin;
    lg.n_rows = g.n_rows;
    lg.contiguous = g.contiguous;
    for (int j = 0; j < n_outs; ++j) {
      const LoraWeight& w = adapter.weight(il, outs[j].target);
      if (w) lg.pairs[j] = LowRankPair{w.a.type, w.a.data, w.b.data, w.rank};
    }
  }
  LowRankOut low_rank_outs[kMaxLowRankOuts];
  for (int j = 0; j < n_outs; ++j) low_rank_outs[j] = LowRankOut{outs[j].y, outs[j].n_out};
  const LowRankScratch scratch{s.x.as<float>(), s.t.as<float>(), s.y.as<float>(),
                               static_cast<int64_t>(s.t.n_bytes() / sizeof(float) / kMaxLowRankOuts),
                               s.max_rank};
  be.add_low_rank(s.groups.data(), static_cast<int>(s.groups.size()), low_rank_outs, n_outs, x, n_in,
                  scratch);
}

}  // namespace ember
