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
  U16 k_cache;      // this layer's key rows, row_u16 words apart
  U16 v_cache;
  I32 positions;    // [n_rows]
  I32 block_table;  // unused when block_size is 0
  uint n_rows;
  uint n_head;
  uint n_head_kv;
  uint head_dim;
  uint row_u16;
  uint block_size;  // 0: contiguous cache
  uint window;      // > 0: sliding window
  float scale;
  float softcap;    // > 0: scores become softcap * tanh(score / softcap)
} p;

const uint kMaxHeadDim = 512u;
shared float qs[kMaxHeadDim];
shared float scores[64];
shared uint slots[64];

// Value e of the cache row at u16 word `row`.
float cached(U16 cache, uint row, uint e) {
#if defined(KV_Q8_0)
  const uint b = row + 17u * (e / 32u);
  return f16_to_f32(uint(cache.v[b])) * float(sbyte_at(cache, b + 1u, e % 32u));
#else
  return f16_to_f32(uint(cache.v[row + e]));
#endif
}

uint slot_of(uint pos) {
  return p.block_size == 0u ? pos : uint(p.block_table.v[pos / p.block_size]) * p.block_size + pos % p.block_size;
}

void main() {
  const uint idx = group_index();
  if (idx >= p.n_rows * p.n_head) return;
  const uint r = idx / p.n_head, h = idx % p.n_head;
  const uint kv_first = (h / (p.n_head / p.n_head_kv)) * p.head_dim;  // this head's values in a row
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
    uint slot = 0u;
    if (key <= pos) {
      slot = slot_of(key);
      const uint row = slot * p.row_u16;
      float dot = 0.0;
      for (uint d = 0u; d < p.head_dim; ++d) dot += qs[d] * cached(p.k_cache, row, kv_first + d);
      score = p.softcap > 0.0 ? softcap(dot * p.scale, p.softcap) : dot * p.scale;
    }
    scores[t] = score;
    slots[t] = slot;
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
      const uint row = slots[j] * p.row_u16;
      for (uint i = 0u; i * 64u + t < p.head_dim; ++i) acc[i] += pj * cached(p.v_cache, row, kv_first + i * 64u + t);
    }
    running_max = new_max;
    barrier();
  }
  const float inv = 1.0 / running_sum;
  for (uint i = 0u; i * 64u + t < p.head_dim; ++i) p.out_.v[q0 + i * 64u + t] = acc[i] * inv;
}
