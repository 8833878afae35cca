#version 450
// matmul_mat.comp: y[n_rows, n_out] = x[n_rows, n_in] · Wᵀ for many rows (prefill), tiled: one
// workgroup per 32 columns x 32 rows; per group of 32 inputs, 32 threads dequantize one weight
// row each into shared memory and 32 load one activation row each, then every thread
// accumulates a 4x4 block of outputs. The sums are matmul_vec.comp's, operation for operation
// (see there), so both kernels give every row the same bits.
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

shared float ws[32][33];  // [column][input] weights of the tile
shared float xs[32][33];  // [row][input] activations of the tile

void main() {
  const uint idx = group_index();
  const uint n_col_tiles = (p.n_out + 31u) / 32u;
  const uint o0 = (idx % n_col_tiles) * 32u, r0 = (idx / n_col_tiles) * 32u;
  if (r0 >= p.n_rows) return;
  const uint t = gl_LocalInvocationID.x;
  const uint ty = t / 8u, tx = t % 8u;  // rows r0 + 4ty .., columns o0 + 4tx ..
  const uint n_groups = (p.n_in + 31u) / 32u;
  precise float acc[4][4];
  for (uint i = 0u; i < 4u; ++i)
    for (uint j = 0u; j < 4u; ++j) acc[i][j] = 0.0;
  for (uint g = 0u; g < n_groups; ++g) {
    if (t < 32u) {
      const uint o = o0 + t;
      float v[32];
      if (o < p.n_out) {
        dq32(p.w, row_start(o, p.n_in), g, p.n_in, v);
      } else {
        for (uint l = 0u; l < 32u; ++l) v[l] = 0.0;
      }
      for (uint l = 0u; l < 32u; ++l) ws[t][l] = v[l];
    } else {
      const uint r = r0 + t - 32u;
      for (uint l = 0u; l < 32u; ++l) {
        const uint k = 32u * g + l;
        xs[t - 32u][l] = r < p.n_rows && k < p.n_in ? p.x.v[r * p.n_in + k] : 0.0;
      }
    }
    barrier();
    const uint n_l = min(32u, p.n_in - 32u * g);
    for (uint i = 0u; i < 4u; ++i) {
      for (uint j = 0u; j < 4u; ++j) {
        precise float s = 0.0;
        for (uint l = 0u; l < n_l; ++l) s = s + ws[4u * tx + j][l] * xs[4u * ty + i][l];
        acc[i][j] = acc[i][j] + s;
      }
    }
    barrier();
  }
  for (uint i = 0u; i < 4u; ++i) {
    const uint r = r0 + 4u * ty + i;
    if (r >= p.n_rows) break;
    for (uint j = 0u; j < 4u; ++j) {
      const uint o = o0 + 4u * tx + j;
      if (o < p.n_out) p.y.v[r * p.n_out + o] = acc[i][j];
    }
  }
}
