#version 450
// attention.comp: causal attention of q[n_rows, n_head * head_dim] over a (paged) cache of f16
// or q8_0 rows (-DKV_Q8_0), one workgroup per (row, head): keys in tiles of 64 (one score per
// thread), an online softmax in f32, each thread accumulating head dims t, t + 64, ...
// A row's result never depends on the other rows of the call.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  F32 q;            // [n_rows, n_head * head_dim]
  F32 out_;         // [n_rows, n_head * head_dim]
  U16 k_cache;      // this layer's keys, in blocks of [n_head_kv][block_size][head_u16] words
  U16 v_cache;
  I32 positions;    // [n_rows]
  I32 block_table;  // unused when paged is 0
  uint n_rows;
  uint n_head;
  uint n_head_kv;
  uint head_dim;
  uint head_u16;    // words of one kv head's values in one slot
  uint block_size;  // slots per block
  uint paged;       // 1: position t is in block block_table[t / block_size]; 0: in block t / block_size
  uint window;      // > 0: sliding window
  float scale;
  float softcap;    // > 0: scores become softcap * tanh(score / softcap)
} p;

const uint kMaxHeadDim = 512u;
shared float qs[kMaxHeadDim];
shared float scores[64];
shared uint rows[64];

// Value e of a kv head's values at u16 word `row`.
float cached(U16 cache, uint row, uint e) {
#if defined(KV_Q8_0)
  const uint b = row + 17u * (e / 32u);
  return f16_to_f32(uint(cache.v[b])) * float(sbyte_at(cache, b + 1u, e % 32u));
#else
  return f16_to_f32(uint(cache.v[row + e]));
#endif
}

// The word where kv head h's values of position pos start (KVView's layout, backend.h).
uint head_row(uint pos, uint h) {
  const uint block = p.paged != 0u ? uint(p.block_table.v[pos / p.block_size]) : pos / p.block_size;
  return ((block * p.n_head_kv + h) * p.block_size + pos % p.block_size) * p.head_u16;
}

void main() {
  const uint idx = group_index();
  if (idx >= p.n_rows * p.n_head) return;
  const uint r = idx / p.n_head, h = idx % p.n_head;
  const uint kv_head = h / (p.n_head / p.n_head_kv);
  const uint t = gl_LocalInvocationID.x;
  const uint q0 = (r * p.n_head + h) * p.head_dim;
  for (uint d = t; d < p.head_dim; d += 64u) qs[d] = p.q.v[q0 + d];
  barrier();

  const uint pos = uint(p.positions.v[r]);
  const uint first = p.window > 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
  float running_max = -1.0 / 0.0, running_sum = 0.0;
  float acc[kMaxHeadDim / 64u];
  for (uint i = 0u; i < kMaxHeadDim / 64u; ++i) acc[i] = 0.0;
  for (uint t0 = first; t0 <= pos; t0 += 64u) {
    const uint key = t0 + t;
    float score = -1.0 / 0.0;
    uint row = 0u;
    if (key <= pos) {
      row = head_row(key, kv_head);
      float dot = 0.0;
      for (uint d = 0u; d < p.head_dim; ++d) dot += qs[d] * cached(p.k_cache, row, d);
      score = p.softcap > 0.0 ? softcap(dot * p.scale, p.softcap) : dot * p.scale;
    }
    scores[t] = score;
    rows[t] = row;
    barrier();
    const uint n = min(64u, pos + 1u - t0);
    float tile_max = -1.0 / 0.0;
    for (uint j = 0u; j < n; ++j) tile_max = max(tile_max, scores[j]);
    const float new_max = max(running_max, tile_max);
    const float correction = exp(running_max - new_max);  // 0 on the first tile
    running_sum *= correction;
    for (uint i = 0u; i < kMaxHeadDim / 64u; ++i) acc[i] *= correction;
    for (uint j = 0u; j < n; ++j) {
      const float pj = exp(scores[j] - new_max);
      running_sum += pj;
      for (uint i = 0u; i * 64u + t < p.head_dim; ++i) acc[i] += pj * cached(p.v_cache, rows[j], i * 64u + t);
    }
    running_max = new_max;
    barrier();
  }
  const float inv = 1.0 / running_sum;
  for (uint i = 0u; i * 64u + t < p.head_dim; ++i) p.out_.v[q0 + i * 64u + t] = acc[i] * inv;
}
