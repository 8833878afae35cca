// backend.cpp: the backend-independent parts of backend.h (buffer ownership, op names).
#include "backend.h"

namespace ember {

const char* op_name(Op op) {
  constexpr const char* kNames[] = {
      "matmul",   "get_rows",  "rms_norm",        "layer_norm", "rope",           "add",
      "add_bias", "silu_mul",  "gelu_mul",        "gelu",       "scale",          "softmax",
      "store_kv", "attention", "add_rows_scaled", "swiglu_oai", "attention_sinks"};
  return kNames[static_cast<int>(op)];
}

void Backend::add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                           const float* x, int64_t n_in, const LowRankScratch& scratch) {
  int64_t begin = 0;  // the group's first row in the scratch
  for (int ig = 0; ig < n_groups; begin += groups[ig].n_rows, ++ig) {
    const LowRankGroup& g = groups[ig];
    MatmulOut a_outs[kMaxLowRankOuts];
    float* ts[kMaxLowRankOuts];
    int n = 0;
    for (int j = 0; j < n_outs; ++j) {
      const LowRankPair& pair = g.pairs[j];
      if (pair.rank == 0) continue;
      ts[j] = scratch.t + j * scratch.t_stride + begin * scratch.max_rank;
      a_outs[n++] = MatmulOut{pair.type, pair.a, pair.rank, ts[j]};
    }
    if (n == 0) continue;
    const float* xg = x + int64_t{g.rows[0]} * n_in;
    if (!g.contiguous) {
      xg = scratch.x_rows + begin * n_in;
      get_rows(DType::f32, x, n_in, g.rows, g.n_rows, scratch.x_rows + begin * n_in);
    }
    // The A products of one group share a matmul_many, so each writes rows rank apart.
    matmul_many(a_outs, n, n_in, xg, g.n_rows);
    for (int j = 0; j < n_outs; ++j) {
      const LowRankPair& pair = g.pairs[j];
      if (pair.rank == 0) continue;
      matmul(pair.type, pair.b, pair.rank, outs[j].n_out, ts[j], g.n_rows, scratch.y_rows);
      add_rows_scaled(scratch.y_rows, g.rows, g.scales, g.n_rows, outs[j].n_out, outs[j].y);
    }
  }
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = other.backend_;
    data_ = other.data_;
    n_bytes_ = other.n_bytes_;
    owned_ = other.owned_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.n_bytes_ = 0;
    other.owned_ = false;
  }
  return *this;
}

void Buffer::reset() {
  if (owned_ && backend_ && data_) backend_->free_buffer(data_, n_bytes_);
  backend_ = nullptr;
  data_ = nullptr;
  n_bytes_ = 0;
  owned_ = false;
}

}  // namespace ember
