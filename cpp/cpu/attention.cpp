// cpu/attention.cpp: causal attention of a sequence's new rows over its f16 KV cache, one
// (row, head) task at a time, threaded over tasks. Each task streams its keys in tiles with an
// online softmax (flash-attention style), so no [n_keys] score buffer is ever allocated.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "cpu/parallel.h"
#include "quant/blocks.h"

namespace ember::cpu {

void attention_head_scalar(const float* q, int64_t n_keys, const KVView& kv, int64_t kv_offset,
                           int64_t head_dim, float scale, float* out) {
  constexpr int64_t kTile = 64;
  float acc[kMaxHeadDim];  // [head_dim] Σ p·v, relative to the running max
  float score[kTile];      // [tile] scaled q·k of the current tile
  std::memset(acc, 0, sizeof(float) * head_dim);
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t t0 = 0; t0 < n_keys; t0 += kTile) {
    const int64_t n = std::min(kTile, n_keys - t0);
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* k = kv.k_row(t0 + j) + kv_offset;
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * f16_to_f32(k[d]);
      score[j] = dot * scale;
      tile_max = std::max(tile_max, score[j]);
    }
    if (tile_max > running_max) {
      const float rescale = std::exp(running_max - tile_max);  // 0 on the first tile
      for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
      running_sum *= rescale;
      running_max = tile_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(score[j] - running_max);
      running_sum += p;
      const uint16_t* v = kv.v_row(t0 + j) + kv_offset;
      for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * f16_to_f32(v[d]);
    }
  }
  const float inv_sum = 1.0f / running_sum;  // n_keys >= 1, so the sum is >= 1
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv_sum;
}

void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
               const AttentionParams& params, float* out, const OpsIsa& isa, ThreadPool& pool) {
  const int64_t n_head = params.n_head, head_dim = params.head_dim;
  const int64_t group = n_head / params.n_head_kv;  // query heads per kv head
  const auto head_kernel =
      isa.avx2_f16c && head_dim % 8 == 0 ? attention_head_avx2 : attention_head_scalar;
  // Tasks are (row, head) with the head fastest, so neighbouring tasks share a kv head's rows.
  const int64_t n_tasks = n_rows * n_head;
  const int64_t max_keys = int64_t{*std::max_element(positions, positions + n_rows)} + 1;
  const int64_t min_tasks = max_keys * head_dim >= 2048 ? 1 : 2048 / (max_keys * head_dim) + 1;
  parallel_for(pool, n_tasks, min_tasks, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / n_head, h = task % n_head;
      const int64_t offset = (r * n_head + h) * head_dim;
      head_kernel(q + offset, int64_t{positions[r]} + 1, kv, (h / group) * head_dim, head_dim,
                  params.scale, out + offset);
    }
  });
}

}  // namespace ember::cpu
