#version 450
// matmul_vec.comp: y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ for few rows (decode): one workgroup
// per output column and group of 4 rows; its 64 threads stride over the row's groups of 32
// weights (each dequantized once and used for all 4 rows), then sum their partials in a tree.
// A row's sum never depends on the other rows of the call.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  U16 w;   // [n_out] rows of n_in weights of the type
  F32 x;   // [n_rows, n_in]
  F32 y;   // [n_rows, n_out]
  uint n_in;
  uint n_out;
  uint n_rows;
} p;

shared float partial[4][64];

void main() {
  const uint idx = group_index();
  const uint o = idx % p.n_out, r0 = (idx / p.n_out) * 4u;
  if (r0 >= p.n_rows) return;  // whole workgroups only
  const uint t = gl_LocalInvocationID.x;
  const uint row = o * row_u16(p.n_in);
  const uint n_groups = (p.n_in + 31u) / 32u;
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  for (uint g = t; g < n_groups; g += 64u) {
    float v[32];
    dq32(p.w, row, g, p.n_in, v);
    const uint n_l = min(32u, p.n_in - 32u * g);
    for (uint r = 0u; r < 4u; ++r) {
      if (r0 + r >= p.n_rows) break;
      const uint xb = (r0 + r) * p.n_in + 32u * g;
      float s = 0.0;
      for (uint l = 0u; l < n_l; ++l) s += v[l] * p.x.v[xb + l];
      acc[r] += s;
    }
  }
  for (uint r = 0u; r < 4u; ++r) partial[r][t] = acc[r];
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (t < s) {
      for (uint r = 0u; r < 4u; ++r) partial[r][t] += partial[r][t + s];
    }
    barrier();
  }
  if (t == 0u) {
    for (uint r = 0u; r < 4u && r0 + r < p.n_rows; ++r) p.y.v[(r0 + r) * p.n_out + o] = partial[r][0];
  }
}
