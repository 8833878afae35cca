// cpu/attention_block.h: causal attention of a block of query rows x query heads that share one
// kv head (decode, prefill and verification alike), written once as a template over an ISA's vector
// primitives and instantiated in attention.cpp (scalar) and attention_avx2.cpp, for each KV row format (f16,
// q8_0). Each tile of cached keys and values is converted to f32 once and then serves every
// query of the block, instead of once per query head and row. Everything here has internal
// linkage (see math_avx2.h for why).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/op_kernels.h"

namespace ember::cpu {
namespace {

constexpr int64_t kBlockTile = 32;  // keys per tile
static_assert(kKeyChunk % kBlockTile == 0);

// score[n] = cap * tanh(score[n] / cap), and the same of `max` (tanh is monotonic, so the capped
// scores' max is the capped max): logit soft-capping (Gemma 2). cap > 0.
inline float softcap_scores(float* score, int64_t n, float max, float cap) {
  const float inv_cap = 1.0f / cap;
  for (int64_t j = 0; j < n; ++j) score[j] = cap * std::tanh(score[j] * inv_cap);
  return cap * std::tanh(max * inv_cap);
}

// fn(j, n, offset) for each run of the tile's positions first .. first + n_tile - 1 that lie in
// one cache block: positions first + j .. first + j + n - 1, whose rows of kv head `head` are
// contiguous from byte `offset` of k (and of v) on (KVView's layout), without a division per
// position.
template <typename Fn>
inline void for_each_run(const KVView& kv, int64_t head, int64_t first, int64_t n_tile, Fn&& fn) {
  int64_t block = first / kv.block_size, in_block = first % kv.block_size;
  for (int64_t j = 0; j < n_tile; ++block, in_block = 0) {
    const int64_t n = n_tile - j < kv.block_size - in_block ? n_tile - j : kv.block_size - in_block;
    const int64_t physical = kv.block_table ? int64_t{kv.block_table[block]} : block;
    fn(j, n, ((physical * kv.n_head_kv + head) * kv.block_size + in_block) * kv.head_bytes);
    j += n;
  }
}

// Asks for the cache lines of one kv head's keys and values of the tile at `first` (n
// positions), so that they arrive while the tile before it is computed.
inline void prefetch_tile(const KVView& kv, int64_t head, int64_t first, int64_t n) {
  for_each_run(kv, head, first, n, [&](int64_t, int64_t n_run, int64_t offset) {
    for (int64_t b = 0; b < n_run * kv.head_bytes; b += 64) {
      __builtin_prefetch(kv.k + offset + b);
      __builtin_prefetch(kv.v + offset + b);
    }
  });
}

// Isa provides, for head_dim-long f32 vectors (head_dim a multiple of the ISA's vector width):
//   scores(q, keys, n_keys, hd, s)      s[j] = q · keys[j * hd ...], returns max_j s[j]
//   exp_and_sum(s, n, max) -> Σ         s[j] = exp(s[j] - max), returns the sum
//   accumulate(p, values, n, hd, acc)   acc[hd] += Σ_j p[j] * values[j * hd ...]
//   kQueryPairs                         whether it has these, each giving every query the bits
//                                       of the one-query primitive:
//   scores_pairs<P>(q, keys, n, hd, s, max)     scores of P pairs of queries (q[2P], s[2P], max[2P])
//   exp_and_sum2(s0, s1, n, max0, max1, &sum0, &sum1)     exp_and_sum of two queries
//   accumulate_pairs<P>(p, values, n, hd, acc)  accumulate for P pairs (p[2P], acc[2P])
// Rows provides, for the cache's row format (kv.type):
//   to_f32(src, dst, n)                 dst[n] = the n values starting at src, as f32 (n a
//                                       multiple of head_dim)
//
// Keys go in chunks of kKeyChunk from position 0: each chunk has its own online softmax, and the
// chunks' states are merged in order (merge_chunk). b.mode says what one call does: every chunk
// of the block's queries and the normalized result (whole), one chunk's state into b.partial
// (chunk), or the merge of b.n_chunks such states and the result (merge). Both ways run the same
// operations, so a query's bits do not depend on which way its block went (attention.cpp splits
// the chunks over threads when a call has few tasks: decode).
template <typename Isa, typename Rows>
void attention_block(const AttentionBlock& b, const KVView& kv) {
  const int64_t hd = b.head_dim, n_queries = b.n_rows * b.n_heads;
  alignas(64) float keys[kBlockTile * kMaxHeadDim];           // [tile, hd] f32 keys of the tile
  alignas(64) float values[kBlockTile * kMaxHeadDim];         // [tile, hd] f32 values of the tile
  alignas(64) float queries[kMaxBlockQueries * kMaxHeadDim];  // [n_queries, hd] q * scale
  alignas(64) float scores[4][kBlockTile + 8];                // of up to 4 queries at once (Isa::kQueryPairs)
  float* const score = scores[0];
  // The chunk's state (running max, sum and Σ p·v), and the merged one of the chunks before it.
  alignas(64) float acc[kMaxBlockQueries * kMaxHeadDim];
  float running_max[kMaxBlockQueries], running_sum[kMaxBlockQueries];
  alignas(64) float total_acc[kMaxBlockQueries * kMaxHeadDim];
  float total_max[kMaxBlockQueries], total_sum[kMaxBlockQueries];
  int64_t n_keys[kMaxBlockQueries];  // keys query i may see: [first_key[i], n_keys[i])
  int64_t first_key[kMaxBlockQueries];

  int64_t n_keys_max = 0, first_min = INT64_MAX;
  for (int64_t r = 0; r < b.n_rows; ++r) {
    for (int64_t h = 0; h < b.n_heads; ++h) {
      const int64_t i = r * b.n_heads + h;
      const float* q = b.q + r * b.row_stride + (b.head_begin + h) * hd;
      for (int64_t d = 0; d < hd; ++d) queries[i * hd + d] = q[d] * b.scale;
      n_keys[i] = int64_t{b.positions[r]} + 1;
      first_key[i] = b.window > 0 && n_keys[i] > b.window ? n_keys[i] - b.window : 0;
      n_keys_max = n_keys[i] > n_keys_max ? n_keys[i] : n_keys_max;
      first_min = first_key[i] < first_min ? first_key[i] : first_min;
      total_max[i] = -INFINITY;
      total_sum[i] = 0.0f;
    }
  }
  std::memset(total_acc, 0, sizeof(float) * n_queries * hd);
  const int64_t state_floats = kMaxBlockQueries * (hd + 2);  // a chunk's state in b.partial: max, sum, acc

  // The online softmax over the keys of chunk c, from a fresh state.
  auto run_chunk = [&](int64_t c) {
    for (int64_t i = 0; i < n_queries; ++i) {
      running_max[i] = -INFINITY;
      running_sum[i] = 0.0f;
    }
    std::memset(acc, 0, sizeof(float) * n_queries * hd);
    const int64_t key_end = (c + 1) * kKeyChunk < n_keys_max ? (c + 1) * kKeyChunk : n_keys_max;
    // Tiles start at multiples of kBlockTile, whatever keys the block's queries see: a query's
    // tiles, and so its bits, do not depend on which rows and heads share its block.
    const int64_t t_first = first_min / kBlockTile * kBlockTile;
    for (int64_t t0 = t_first > c * kKeyChunk ? t_first : c * kKeyChunk; t0 < key_end; t0 += kBlockTile) {
      const int64_t n_tile = key_end - t0 < kBlockTile ? key_end - t0 : kBlockTile;
      if (t0 + kBlockTile < key_end) {
        const int64_t n_next = key_end - t0 - kBlockTile;
        prefetch_tile(kv, b.kv_head, t0 + kBlockTile, n_next < kBlockTile ? n_next : kBlockTile);
      }
      for_each_run(kv, b.kv_head, t0, n_tile, [&](int64_t j, int64_t n, int64_t offset) {
        Rows::to_f32(kv.k + offset, keys + j * hd, n * hd);
        Rows::to_f32(kv.v + offset, values + j * hd, n * hd);
      });
      // The keys [j0, j0 + n) of the tile that query i sees (n <= 0: none).
      auto visible = [&](int64_t i, int64_t* j0) {
        if (n_keys[i] <= t0 || first_key[i] >= t0 + n_tile) return int64_t{0};  // future / before its window
        *j0 = first_key[i] > t0 ? first_key[i] - t0 : 0;
        return (n_keys[i] - t0 < n_tile ? n_keys[i] - t0 : n_tile) - *j0;
      };
      // Query i's online-softmax step over its n scores s of this tile (tile_max their max): cap
      // them, and rescale what it has summed if the max grew; then s = exp(s - max) (exp_and_sum).
      auto rescale_step = [&](int64_t i, float* s, int64_t n, float tile_max) {
        if (b.softcap > 0.0f) tile_max = softcap_scores(s, n, tile_max, b.softcap);
        if (tile_max > running_max[i]) {
          const float rescale = std::exp(running_max[i] - tile_max);  // 0 on the first tile
          for (int64_t d = 0; d < hd; ++d) acc[i * hd + d] *= rescale;
          running_sum[i] *= rescale;
          running_max[i] = tile_max;
        }
      };
      for (int64_t i = 0; i < n_queries; ++i) {
        int64_t j0 = 0;
        const int64_t n = visible(i, &j0);
        if (n <= 0) continue;
        if constexpr (Isa::kQueryPairs) {
          // Queries that see the same keys go through the tile together, four (two pairs, which
          // share the key and value loads) or two at a time (Isa's pair primitives give each
          // query the bits of the single ones).
          int64_t same = 1;
          for (int64_t j1 = 0; same < 4 && i + same < n_queries; ++same) {
            if (visible(i + same, &j1) != n || j1 != j0) break;
          }
          // Queries i .. i + 2P - 1 (P pairs) through the tile.
          auto pairs = [&]<int P>() {
            const float* q[2 * P];
            float* s[2 * P];
            float* a[2 * P];
            float max[2 * P];
            for (int k = 0; k < 2 * P; ++k) {
              q[k] = queries + (i + k) * hd;
              s[k] = scores[k];
              a[k] = acc + (i + k) * hd;
            }
            Isa::template scores_pairs<P>(q, keys + j0 * hd, n, hd, s, max);
            for (int k = 0; k < 2 * P; ++k) rescale_step(i + k, s[k], n, max[k]);
            for (int k = 0; k < 2 * P; k += 2) {
              float sum0, sum1;
              Isa::exp_and_sum2(s[k], s[k + 1], n, running_max[i + k], running_max[i + k + 1], &sum0, &sum1);
              running_sum[i + k] += sum0;
              running_sum[i + k + 1] += sum1;
            }
            Isa::template accumulate_pairs<P>(s, values + j0 * hd, n, hd, a);
            i += 2 * P - 1;
          };
          if (same >= 2) {
            if (same == 4) {
              pairs.template operator()<2>();
            } else {
              pairs.template operator()<1>();
            }
            continue;
          }
        }
        rescale_step(i, score, n, Isa::scores(queries + i * hd, keys + j0 * hd, n, hd, score));
        running_sum[i] += Isa::exp_and_sum(score, n, running_max[i]);
        Isa::accumulate(score, values + j0 * hd, n, hd, acc + i * hd);
      }
    }
  };
  // The total state gains a chunk's (max m, sum s, acc a of each query; m = -inf: it saw no key
  // there). On the first chunk a query sees, the total becomes that chunk's state exactly
  // (exp(-inf) = 0, exp(0) = 1), so a query within one chunk gets the bits of one online softmax.
  auto merge_chunk = [&](const float* m, const float* s, const float* a) {
    for (int64_t i = 0; i < n_queries; ++i) {
      if (m[i] == -INFINITY) continue;
      const float new_max = total_max[i] > m[i] ? total_max[i] : m[i];
      const float old_scale = std::exp(total_max[i] - new_max), chunk_scale = std::exp(m[i] - new_max);
      total_sum[i] = std::fma(total_sum[i], old_scale, s[i] * chunk_scale);
      for (int64_t d = 0; d < hd; ++d) {
        total_acc[i * hd + d] = std::fma(total_acc[i * hd + d], old_scale, a[i * hd + d] * chunk_scale);
      }
      total_max[i] = new_max;
    }
  };

  if (b.mode == AttentionMode::chunk) {
    run_chunk(b.chunk);
    float* state = b.partial;
    std::memcpy(state, running_max, sizeof(float) * n_queries);
    std::memcpy(state + n_queries, running_sum, sizeof(float) * n_queries);
    std::memcpy(state + 2 * n_queries, acc, sizeof(float) * n_queries * hd);
    return;
  }
  if (b.mode == AttentionMode::merge) {
    for (int64_t c = 0; c < b.n_chunks; ++c) {
      const float* state = b.partial + c * state_floats;
      merge_chunk(state, state + n_queries, state + 2 * n_queries);
    }
  } else {
    for (int64_t c = first_min / kKeyChunk; c * kKeyChunk < n_keys_max; ++c) {
      run_chunk(c);
      merge_chunk(running_max, running_sum, acc);
    }
  }
  for (int64_t r = 0; r < b.n_rows; ++r) {
    for (int64_t h = 0; h < b.n_heads; ++h) {
      const int64_t i = r * b.n_heads + h;
      float* out = b.out + r * b.row_stride + (b.head_begin + h) * hd;
      // A sink s joins the softmax as one more score without a value: exp(s - max) more in the
      // sum (exp overflowing to inf gives the sink's limit, an output of 0).
      const float sink = b.sinks ? std::exp(b.sinks[b.head_begin + h] - total_max[i]) : 0.0f;
      const float inv_sum = 1.0f / (total_sum[i] + sink);  // every query sees >= 1 key
      for (int64_t d = 0; d < hd; ++d) out[d] = total_acc[i * hd + d] * inv_sum;
    }
  }
}

}  // namespace
}  // namespace ember::cpu
