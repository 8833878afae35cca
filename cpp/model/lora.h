// model/lora.h: LoRA adapters of a loaded model and the batched low-rank product a forward pass
// adds per row. An adapter is llama.cpp's LoRA GGUF (general.type "adapter", adapter.type
// "lora", adapter.lora.alpha, general.architecture the base model's), whose tensors pair up as
// "<base tensor>.lora_a" {n_in, rank} and "<base tensor>.lora_b" {rank, n_out} (ggml order), so
// that W·x becomes W·x + scale · alpha / rank · B·(A·x). Loaded once beside the model's weights,
// immutable after; requests of different adapters share a batch (each row names its adapter).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "model/model.h"
#include "model/weights.h"

namespace ember {

struct ForwardBatch;

// The projections an adapter may carry, per layer (llama.cpp's tensor names in lora.cpp).
enum class LoraTarget { q, k, v, o, gate, up, down };
inline constexpr int kLoraTargets = 7;

// One projection's low-rank pair, as the backend's matmul reads them (prepared): f16 where the
// file's pair is f16, else f32.
struct LoraWeight {
  WeightTensor a;    // {n_in, rank}
  WeightTensor b;    // {rank, n_out}, alpha / rank folded in (alpha 0: 1, as llama.cpp)
  int64_t rank = 0;  // 0: the adapter leaves this projection alone

  explicit operator bool() const { return rank > 0; }
};

class LoraAdapter {
 public:
  // Reads the LoRA GGUF at `path` for `model` (f32 or f16 tensors; an f16 pair stays f16). Throws
  // FormatError naming the file and the key or tensor (not an adapter, another architecture, a
  // tensor of no projection of the model, a shape that does not fit it), Unsupported for a
  // backend without the ops the product needs.
  static std::shared_ptr<const LoraAdapter> load(const std::string& path, std::shared_ptr<const Model> model);

  const std::string& path() const { return path_; }
  float alpha() const { return alpha_; }
  int64_t max_rank() const { return max_rank_; }
  int64_t n_weights() const { return n_weights_; }  // projections it changes, all layers
  // A hash of what it computes (alpha, every A and B value, in order): equal for equal adapters
  // whatever their file's name, different for different ones (the prefix cache's namespace).
  uint64_t identity() const { return identity_; }
  const LoraWeight& weight(int64_t il, LoraTarget target) const {
    return layers_[static_cast<size_t>(il)][static_cast<size_t>(target)];
  }

 private:
  LoraAdapter() = default;

  std::string path_;
  float alpha_ = 0.0f;
  int64_t max_rank_ = 0;
  int64_t n_weights_ = 0;
  uint64_t identity_ = 0;
  std::vector<std::array<LoraWeight, kLoraTargets>> layers_;  // [n_layer]

  std::shared_ptr<const Model> model_;           // its backend holds the prepared weights
  std::vector<std::vector<float>> host_;         // the f32 values (identity's input, the f32 weights' source)
  std::vector<std::vector<uint16_t>> host_f16_;  // the f16 weights' source: the prepared ones may view it
  std::vector<Buffer> prepared_;                 // Backend::prepare_matmul_weight of each A and B
};

// The rows of a pass that run with an adapter, grouped by adapter: the host tables the LoRA ops
// read. Built once per pass for all rows and once for the last layer's output rows; sized at
// n_batch once (Scratch), so building never allocates.
struct LoraRows {
  struct Group {
    int32_t adapter = -1;  // index into the batch's adapters
    int64_t begin = 0;     // its rows are ids[begin, begin + n_rows)
    int64_t n_rows = 0;
    bool contiguous = false;  // ids are consecutive: the rows are read in place, not gathered
  };
  std::vector<Group> groups;
  std::vector<int32_t> ids;   // [rows with an adapter] row indexes, grouped, ascending in a group
  std::vector<float> scales;  // [same] each row's request scale

  void reserve(int64_t n_batch);
  // The groups of rows [0, n_rows) of `batch`, where row i is batch row row_of[i] (nullptr: i).
  // one_row_groups: every row a group of its own (a matmul whose rounding depends on its row
  // count then stays batch-invariant).
  void build(const ForwardBatch& batch, const int32_t* row_of, int64_t n_rows, bool one_row_groups);
  bool empty() const { return groups.empty(); }
};

// LoRA buffers of a scratch (Backend::add_low_rank's LowRankScratch) and the groups of one call.
struct LoraScratch {
  Buffer x;  // f32 [n_batch, max(n_embd, n_q_dim, n_ff)] the groups' input rows, gathered
  Buffer t;  // f32 [kMaxLowRankOuts][n_batch, max_rank] A · x of each output
  Buffer y;  // f32 [n_batch, max(n_embd, n_q_dim, n_kv_dim, n_ff)] B · (A · x)
  int64_t max_rank = 0;
  LoraRows all_rows, output_rows;    // the pass's groups, and those of the last layer's output rows
  std::vector<LowRankGroup> groups;  // [n_batch] add_lora's, with this call's pairs

  LoraScratch() = default;
  LoraScratch(Backend& backend, const ModelConfig& c, int64_t n_batch, int64_t max_rank);
};

// One projection add_lora changes: its target and output rows y [*, n_out].
struct LoraOut {
  LoraTarget target;
  float* y;
  int64_t n_out;
};

// y[r] += scale[r] · B · (A · x[r]) for the rows r of `rows` and each of outs[n_outs] (at most
// kMaxLowRankOuts projections of the same input: q, k and v; gate and up), with each group's
// adapter's pair of the output's target in layer il (a group whose adapter leaves it alone adds
// nothing); x [*, n_in] and the y are rows of the pass's buffers. One Backend::add_low_rank.
void add_lora(Backend& be, const ForwardBatch& batch, LoraScratch& s, const LoraRows& rows, int64_t il,
              const LoraOut* outs, int n_outs, const float* x, int64_t n_in);

}  // namespace ember
