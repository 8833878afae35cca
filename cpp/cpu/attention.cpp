// cpu/attention.cpp: causal attention of a sequence's new rows over its KV cache (f16 or q8_0
// rows), one (row, head) task at a time, threaded over tasks. Each task streams its keys in
// tiles with an online softmax (flash-attention style), so no [n_keys] score buffer is ever
// allocated. Cached values are converted to f32 and everything accumulates in f32.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/attention_block.h"
#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "cpu/parallel.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember::cpu {

namespace {

// The KV row formats in portable C++ (attention_avx2.cpp has their AVX2 twins): where a head's
// values start in a row, and those values as f32.
struct F16Rows {
  static const uint8_t* at(const uint8_t* row, int64_t first) {
    return row + first * int64_t{sizeof(uint16_t)};
  }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
  }
};

// Blocks of 32 values (first and n are multiples of 32): value i of a block is d * qs[i].
struct Q8Rows {
  static const uint8_t* at(const uint8_t* row, int64_t first) {
    return row + first / kQK * int64_t{sizeof(BlockQ8_0)};
  }
  static void to_f32(const uint8_t* src, float* dst, int64_t n) { dequantize_row_q8_0(src, dst, n); }
};

template <typename Rows>
void attention_head(const float* q, int64_t first_key, int64_t n_keys, const KVView& kv, int64_t kv_offset,
                    int64_t head_dim, float scale, float softcap, float* out) {
  constexpr int64_t kTile = 64;
  float acc[kMaxHeadDim];  // [head_dim] Σ p·v, relative to the running max
  float row[kMaxHeadDim];  // [head_dim] the current key or value, as f32
  float score[kTile];      // [tile] scaled q·k of the current tile
  std::memset(acc, 0, sizeof(float) * head_dim);
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t t0 = first_key; t0 < n_keys; t0 += kTile) {
    const int64_t n = std::min(kTile, n_keys - t0);
    float tile_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      Rows::to_f32(Rows::at(kv.k_row(t0 + j), kv_offset), row, head_dim);
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * row[d];
      score[j] = dot * scale;
      tile_max = std::max(tile_max, score[j]);
    }
    if (softcap > 0.0f) tile_max = softcap_scores(score, n, tile_max, softcap);
    if (tile_max > running_max) {
      const float rescale = std::exp(running_max - tile_max);  // 0 on the first tile
      for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
      running_sum *= rescale;
      running_max = tile_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float p = std::exp(score[j] - running_max);
      running_sum += p;
      Rows::to_f32(Rows::at(kv.v_row(t0 + j), kv_offset), row, head_dim);
      for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * row[d];
    }
  }
  const float inv_sum = 1.0f / running_sum;  // n_keys >= 1, so the sum is >= 1
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv_sum;
}

// attention_block's primitives in portable C++ (8 partial sums so compilers can vectorize).
struct ScalarIsa {
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

void attention_head_scalar(const float* q, int64_t first_key, int64_t n_keys, const KVView& kv,
                           int64_t kv_offset, int64_t head_dim, float scale, float softcap, float* out) {
  if (kv.type == DType::q8_0) {
    return attention_head<Q8Rows>(q, first_key, n_keys, kv, kv_offset, head_dim, scale, softcap, out);
  }
  attention_head<F16Rows>(q, first_key, n_keys, kv, kv_offset, head_dim, scale, softcap, out);
}

void attention_block_scalar(const AttentionBlock& block, const KVView& kv) {
  if (kv.type == DType::q8_0) return attention_block<ScalarIsa, Q8Rows>(block, kv);
  attention_block<ScalarIsa, F16Rows>(block, kv);
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
      const int64_t n_keys = int64_t{positions[r]} + 1;
      const int64_t first = params.window > 0 ? std::max<int64_t>(0, n_keys - params.window) : 0;
      head_kernel(q + offset, first, n_keys, kv, (h / group) * head_dim, head_dim, params.scale,
                  params.softcap, out + offset);
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
    b.softcap = params.softcap;
    b.window = params.window;
    block_kernel(b, kv);
  });
}

}  // namespace ember::cpu
