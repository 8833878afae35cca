#version 450
// rope.comp: rotates x[n_rows, n_heads, head_dim] in place, one invocation per (row, head, pair);
// pair i is (2i, 2i+1) (interleaved) or (i, i + n_rot/2) (neox), at angle position * inv_freq[i]
// (the f32 product, as on the CPU), reduced to [-pi, pi] before sin/cos, both scaled by mscale.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  F32 x;
  I32 positions;  // [n_rows]
  F32 inv_freq;   // [n_pairs]
  uint n_rows;
  uint n_heads;
  uint head_dim;
  uint n_pairs;  // n_rot / 2
  uint neox;
  float mscale;  // multiplies cos and sin (LongRoPE's attention factor)
} p;

void main() {
  const uint i = group_index() * 256u + gl_LocalInvocationID.x;
  if (i >= p.n_rows * p.n_heads * p.n_pairs) return;
  const uint pair = i % p.n_pairs, rh = i / p.n_pairs, r = rh / p.n_heads;
  precise float theta = float(p.positions.v[r]) * p.inv_freq.v[pair];
  // Cody-Waite reduction by 2pi = 6.28125 + 1.9353071795864769e-3 (k * 6.28125 is exact).
  const float k = floor(theta * 0.15915494309189535 + 0.5);
  precise float reduced = (theta - k * 6.28125) - k * 1.9353071795864769e-3;
  const float c = cos(reduced) * p.mscale, s = sin(reduced) * p.mscale;
  const uint base = rh * p.head_dim;
  const uint a = base + (p.neox != 0u ? pair : 2u * pair);
  const uint b = a + (p.neox != 0u ? p.n_pairs : 1u);
  const float a0 = p.x.v[a], b0 = p.x.v[b];
  p.x.v[a] = a0 * c - b0 * s;
  p.x.v[b] = a0 * s + b0 * c;
}
