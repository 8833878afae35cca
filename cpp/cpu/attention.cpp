// cpu/attention.cpp: causal attention of a sequence's new rows over its f16 KV cache, one
// (row, head) task at a time, threaded over tasks. Each task streams its keys in tiles with an
// online softmax (flash-attention style), so no [n_keys] score buffer is ever allocated.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/attention_block.h"
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

namespace {

// attention_block's primitives in portable C++ (8 partial sums so compilers can vectorize).
struct ScalarIsa {
  static void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = ember::f16_to_f32(src[i]);
  }
  static float scores(const float* q, const float* keys, int64_t n_keys, int64_t hd, float* score) {
    float max = -INFINITY;
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* k = keys + j * hd;
      float partial[8] = {};
      int64_t d = 0;
      for (; d + 8 <= hd; d += 8) {
        for (int e = 0; e < 8; ++e) partial[e] += q[d + e] * k[d + e];
      }
      float dot = 0.0f;
      for (; d < hd; ++d) dot += q[d] * k[d];
      for (int e = 0; e < 8; ++e) dot += partial[e];
      score[j] = dot;
      max = std::max(max, dot);
    }
    return max;
  }
  static float exp_and_sum(float* score, int64_t n, float max) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      score[j] = std::exp(score[j] - max);
      sum += score[j];
    }
    return sum;
  }
  static void accumulate(const float* p, const float* values, int64_t n, int64_t hd, float* acc) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t d = 0; d < hd; ++d) acc[d] += p[j] * values[j * hd + d];
    }
  }
};

}  // namespace

void attention_block_scalar(const AttentionBlock& block, const KVView& kv) {
  attention_block<ScalarIsa>(block, kv);
}

void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
               const AttentionParams& params, float* out, const OpsIsa& isa, ThreadPool& pool) {
  const int64_t n_head = params.n_head, head_dim = params.head_dim;
  const int64_t group = n_head / params.n_head_kv;  // query heads per kv head
  const bool simd = isa.avx2_f16c && head_dim % 8 == 0;
  const int64_t max_keys = int64_t{*std::max_element(positions, positions + n_rows)} + 1;
  // Below ~2K multiply-adds per task, waking a worker costs more than the task.
  const bool tiny = n_rows * n_head * max_keys * head_dim < 4096;

  if (n_rows == 1 || group > kMaxBlockQueries) {
    // Decode: one task per (row, head), so every thread has work even with few kv heads.
    const auto head_kernel = simd ? attention_head_avx2 : attention_head_scalar;
    parallel_tasks(pool, n_rows * n_head, tiny, [&](int64_t task) {
      const int64_t r = task / n_head, h = task % n_head;
      const int64_t offset = (r * n_head + h) * head_dim;
      head_kernel(q + offset, int64_t{positions[r]} + 1, kv, (h / group) * head_dim, head_dim,
                  params.scale, out + offset);
    });
    return;
  }

  // Prefill: tasks of (block of rows, kv head), each converting a cache tile once for all its
  // queries. Later rows see more keys, so tasks go out from the last block back (longest first).
  const auto block_kernel = simd ? attention_block_avx2 : attention_block_scalar;
  const int64_t rows_per_block = kMaxBlockQueries / group;
  const int64_t n_blocks = (n_rows + rows_per_block - 1) / rows_per_block;
  parallel_tasks(pool, n_blocks * params.n_head_kv, tiny, [&](int64_t task) {
    const int64_t block = n_blocks - 1 - task / params.n_head_kv, kv_head = task % params.n_head_kv;
    const int64_t r0 = block * rows_per_block;
    AttentionBlock b;
    b.q = q + r0 * n_head * head_dim;
    b.out = out + r0 * n_head * head_dim;
    b.row_stride = n_head * head_dim;
    b.positions = positions + r0;
    b.n_rows = std::min(rows_per_block, n_rows - r0);
    b.head_begin = kv_head * group;
    b.n_heads = group;
    b.kv_offset = kv_head * head_dim;
    b.head_dim = head_dim;
    b.scale = params.scale;
    block_kernel(b, kv);
  });
}

}  // namespace ember::cpu
