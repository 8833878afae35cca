#version 450
// matmul_vec.comp: y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ for few rows (decode): one invocation
// per output column and group of 4 rows, walking the weight row once (each group of 32 weights
// dequantized once for the 4 rows), no shared memory and no barriers.
// Every output is Σ over groups g (in order) of the group's Σ over its 32 products (in order),
// each operation rounded (`precise`: no fusing): the same bits as matmul_mat.comp, so a row's
// result depends neither on the other rows of the call nor on which kernel ran.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  U16 w;  // [n_out] rows of n_in weights of the type
  F32 x;  // [n_rows, n_in]
  F32 y;  // [n_rows, n_out]
  uint n_in;
  uint n_out;
  uint n_rows;
} p;

void main() {
  const uint o = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x, r0 = gl_WorkGroupID.y * 4u;
  if (o >= p.n_out || r0 >= p.n_rows) return;
  const uint row = row_start(o, p.n_in);
  const uint n_groups = (p.n_in + 31u) / 32u;
  const uint n_r = min(4u, p.n_rows - r0);
  precise float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
  for (uint g = 0u; g < n_groups; ++g) {
    float v[32];
    dq32(p.w, row, g, p.n_in, v);
    const uint n_l = min(32u, p.n_in - 32u * g);
    [[unroll]] for (uint r = 0u; r < 4u; ++r) {
      if (r >= n_r) break;
      const uint xb = (r0 + r) * p.n_in + 32u * g;
      precise float s = 0.0;
      if (n_l == 32u) {
        [[unroll]] for (uint l = 0u; l < 32u; ++l) s = s + v[l] * p.x.v[xb + l];
      } else {
        for (uint l = 0u; l < n_l; ++l) s = s + v[l] * p.x.v[xb + l];
      }
      acc[r] = acc[r] + s;
    }
  }
  for (uint r = 0u; r < n_r; ++r) p.y.v[(r0 + r) * p.n_out + o] = acc[r];
}
