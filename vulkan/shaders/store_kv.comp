#version 450
// store_kv.comp: writes k, v [n_rows, n_kv_dim] into the cache slots of positions[] as f16, or
// as q8_0 blocks quantized like quant/quantize_row_q8_0: one invocation per (row, 32 values).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  F32 k;            // [n_rows, n_kv_dim]
  F32 v;            // [n_rows, n_kv_dim]
  U16 k_cache;      // this layer's key rows, row_u16 words apart
  U16 v_cache;      // this layer's value rows
  I32 positions;    // [n_rows]
  I32 block_table;  // [blocks of the sequence]; unused when block_size is 0
  uint n_rows;
  uint n_kv_dim;
  uint row_u16;
  uint block_size;  // 0: contiguous cache (slot = position)
  uint q8;          // 1: q8_0 rows, 0: f16 rows
} p;

// gguf-py's np_roundf: half away from zero.
float np_roundf(float x) {
  const float a = abs(x), f = floor(a);
  const float b = f + floor(2.0 * (a - f));
  return x > 0.0 ? b : (x < 0.0 ? -b : x);
}

void store(F32 src, U16 cache, uint r, uint g, uint slot) {
  const uint s0 = r * p.n_kv_dim + 32u * g;
  const uint row = slot * p.row_u16;
  if (p.q8 == 0u) {
    for (uint l = 0u; l < 32u && 32u * g + l < p.n_kv_dim; ++l)
      cache.v[row + 32u * g + l] = uint16_t(f32_to_f16(src.v[s0 + l]));
    return;
  }
  float amax = 0.0;
  for (uint l = 0u; l < 32u; ++l) amax = max(amax, abs(src.v[s0 + l]));
  const float d = amax / 127.0;
  const float id = d == 0.0 ? 0.0 : 1.0 / d;
  const uint b = row + 17u * g;
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
  const uint slot = p.block_size == 0u ? pos
                                       : uint(p.block_table.v[pos / p.block_size]) * p.block_size + pos % p.block_size;
  store(p.k, p.k_cache, r, g, slot);
  store(p.v, p.v_cache, r, g, slot);
}
