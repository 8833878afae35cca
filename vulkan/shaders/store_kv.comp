#version 450
// store_kv.comp: writes k, v [n_rows, n_kv_dim] into the cache slots of positions[] as f16, or
// as q8_0 blocks quantized like quant/quantize_row_q8_0: one invocation per (row, 32 values).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  F32 k;            // [n_rows, n_kv_dim]
  F32 v;            // [n_rows, n_kv_dim]
  U16 k_cache;      // this layer's keys, in blocks of [n_head_kv][block_size][head_u16] words
  U16 v_cache;      // this layer's values, the same
  I32 positions;    // [n_rows]
  I32 block_table;  // [blocks of the sequence]; unused when paged is 0
  uint n_rows;
  uint n_kv_dim;
  uint head_dim;    // values of one kv head
  uint head_u16;    // words of one kv head's values in one slot
  uint block_size;  // slots per block
  uint paged;       // 1: position t is in block block_table[t / block_size]; 0: in block t / block_size
  uint q8;          // 1: q8_0 rows, 0: f16 rows
} p;

// The word where kv head h's values of position pos start (KVView's layout, backend.h).
uint head_row(uint pos, uint h) {
  const uint block = p.paged != 0u ? uint(p.block_table.v[pos / p.block_size]) : pos / p.block_size;
  return ((block * (p.n_kv_dim / p.head_dim) + h) * p.block_size + pos % p.block_size) * p.head_u16;
}

// gguf-py's np_roundf: half away from zero.
float np_roundf(float x) {
  const float a = abs(x), f = floor(a);
  const float b = f + floor(2.0 * (a - f));
  return x > 0.0 ? b : (x < 0.0 ? -b : x);
}

void store(F32 src, U16 cache, uint r, uint g, uint pos) {
  const uint s0 = r * p.n_kv_dim + 32u * g;
  if (p.q8 == 0u) {
    for (uint l = 0u; l < 32u && 32u * g + l < p.n_kv_dim; ++l) {
      const uint e = 32u * g + l;
      cache.v[head_row(pos, e / p.head_dim) + e % p.head_dim] = uint16_t(f32_to_f16(src.v[s0 + l]));
    }
    return;
  }
  float amax = 0.0;
  for (uint l = 0u; l < 32u; ++l) amax = max(amax, abs(src.v[s0 + l]));
  const float d = amax / 127.0;
  const float id = d == 0.0 ? 0.0 : 1.0 / d;
  // head_dim is a multiple of 32 for q8_0: the 32 values are one block of one head
  const uint b = head_row(pos, 32u * g / p.head_dim) + 17u * (32u * g % p.head_dim / 32u);
  cache.v[b] = uint16_t(f32_to_f16(d));
  for (uint j = 0u; j < 16u; ++j) {
    const int q0 = int(np_roundf(src.v[s0 + 2u * j] * id));
    const int q1 = int(np_roundf(src.v[s0 + 2u * j + 1u] * id));
    cache.v[b + 1u + j] = uint16_t((uint(q0) & 0xffu) | ((uint(q1) & 0xffu) << 8));
  }
}

void main() {
  const uint n_groups = (p.n_kv_dim + 31u) / 32u;
  const uint i = group_index() * 64u + gl_LocalInvocationID.x;
  if (i >= p.n_rows * n_groups) return;
  const uint r = i / n_groups, g = i % n_groups;
  const uint pos = uint(p.positions.v[r]);
  store(p.k, p.k_cache, r, g, pos);
  store(p.v, p.v_cache, r, g, pos);
}
