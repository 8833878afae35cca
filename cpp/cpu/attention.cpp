// cpu/attention.cpp: causal attention of a sequence's new rows over its KV cache (f16 or q8_0
// rows), threaded over tasks of (rows, kv head, query heads): attention_block.h streams the keys
// in tiles with an online softmax (flash-attention style), so no [n_keys] score buffer is ever
// allocated. Cached values are converted to f32 and everything accumulates in f32.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/attention_block.h"
#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "cpu/parallel.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ember::cpu {

namespace {

// The KV row formats in portable C++ (attention_avx2.cpp has their AVX2 twins): a head's values
// as f32.
struct F16Rows {
  static void to_f32(const uint8_t* src, float* dst, int64_t n) {
    const auto* h = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
  }
};

// Blocks of 32 values (first and n are multiples of 32): value i of a block is d * qs[i].
struct Q8Rows {
  static void to_f32(const uint8_t* src, float* dst, int64_t n) { dequantize_row_q8_0(src, dst, n); }
};

// attention_block's primitives in portable C++ (8 partial sums so compilers can vectorize).
struct ScalarIsa {
  static constexpr bool kQueryPairs = false;
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
  if (kv.type == DType::q8_0) return attention_block<ScalarIsa, Q8Rows>(block, kv);
  attention_block<ScalarIsa, F16Rows>(block, kv);
}

void attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
               const AttentionParams& params, float* out, const OpKernels& kernels, ThreadPool& pool) {
  const int64_t n_head = params.n_head, head_dim = params.head_dim;
  const int64_t group = n_head / params.n_head_kv;  // query heads per kv head
  const auto block_kernel = kernels.for_rows(head_dim).attention_block;
  const int64_t max_keys = int64_t{*std::max_element(positions, positions + n_rows)} + 1;
  // Below ~2K multiply-adds per task, waking a worker costs more than the task.
  const bool tiny = n_rows * n_head * max_keys * head_dim < 4096;

  // Tasks of (block of rows, kv head, part of its query heads), each converting a cache tile once
  // for all its queries. A query's result does not depend on the rows and heads that share its
  // block, so decode, prefill chunks and speculative verification agree bit for bit. Parts: as
  // few as the block size allows, more when there are fewer tasks (times key chunks) than threads
  // (decode with few kv heads). Later rows see more keys, so tasks go out from the last block back
  // (longest first).
  // Key chunks count as parallel work too (below): only a short context splits the query heads.
  const int64_t n_chunks = (max_keys + kKeyChunk - 1) / kKeyChunk;
  int64_t n_parts = (group + kMaxBlockQueries - 1) / kMaxBlockQueries;
  int64_t heads_per_part = (group + n_parts - 1) / n_parts;
  int64_t rows_per_block = kMaxBlockQueries / heads_per_part;
  const int64_t n_blocks = (n_rows + rows_per_block - 1) / rows_per_block;
  while (n_blocks * params.n_head_kv * n_parts * n_chunks < pool.n_threads() && heads_per_part > 1) {
    ++n_parts;
    heads_per_part = (group + n_parts - 1) / n_parts;
  }
  n_parts = (group + heads_per_part - 1) / heads_per_part;
  const int64_t n_tasks = n_blocks * params.n_head_kv * n_parts;
  // Task t's block of queries (chunk mode and partial are set by the caller).
  auto block_of = [&](int64_t task) {
    const int64_t block = n_blocks - 1 - task / (params.n_head_kv * n_parts);
    const int64_t kv_head = task / n_parts % params.n_head_kv, part = task % n_parts;
    const int64_t r0 = block * rows_per_block;
    AttentionBlock b;
    b.q = q + r0 * n_head * head_dim;
    b.out = out + r0 * n_head * head_dim;
    b.row_stride = n_head * head_dim;
    b.positions = positions + r0;
    b.n_rows = std::min(rows_per_block, n_rows - r0);
    b.head_begin = kv_head * group + part * heads_per_part;
    b.n_heads = std::min(heads_per_part, group - part * heads_per_part);
    b.kv_head = kv_head;
    b.head_dim = head_dim;
    b.scale = params.scale;
    b.softcap = params.softcap;
    b.window = params.window;
    b.sinks = params.sinks;
    return b;
  };
  // Fewer tasks than threads can share (decode, verification of a few rows): the key chunks of
  // each task go out as tasks of their own, and the one that finishes a task's last chunk merges
  // them (the operations of one task doing all its chunks: see attention_block.h). SmolLM2 (3 kv
  // heads), 2 threads, one row at 800 keys: 3 tasks become 12.
  if (n_chunks > 1 && n_tasks < 2 * pool.n_threads() && !tiny) {
    const int64_t state_floats = kMaxBlockQueries * (head_dim + 2);
    // The calling thread's buffers, shared with the workers for the call (no allocation per step
    // once they have grown).
    thread_local std::vector<float> partials;
    thread_local std::vector<std::atomic<int64_t>> chunks_left;
    partials.resize(static_cast<size_t>(n_tasks * n_chunks * state_floats));
    if (chunks_left.size() < static_cast<size_t>(n_tasks)) {
      chunks_left = std::vector<std::atomic<int64_t>>(static_cast<size_t>(n_tasks));
    }
    for (int64_t task = 0; task < n_tasks; ++task) {
      chunks_left[task].store(n_chunks, std::memory_order_relaxed);
    }
    float* const states = partials.data();
    std::atomic<int64_t>* const left = chunks_left.data();
    parallel_tasks(pool, n_tasks * n_chunks, false, [&](int64_t t) {
      const int64_t task = t / n_chunks;
      AttentionBlock b = block_of(task);
      b.mode = AttentionMode::chunk;
      b.chunk = n_chunks - 1 - t % n_chunks;  // later chunks hold more rows' keys: longest first
      b.partial = states + (task * n_chunks + b.chunk) * state_floats;
      block_kernel(b, kv);
      if (left[task].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        b.mode = AttentionMode::merge;
        b.n_chunks = n_chunks;
        b.partial = states + task * n_chunks * state_floats;
        block_kernel(b, kv);
      }
    });
    return;
  }
  parallel_tasks(pool, n_tasks, tiny, [&](int64_t task) { block_kernel(block_of(task), kv); });
}

}  // namespace ember::cpu
