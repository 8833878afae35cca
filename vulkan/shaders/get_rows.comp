#version 450
// get_rows.comp: y[n_ids, n_cols] = rows ids[] of a table {n_cols, *} of the type, dequantized
// (bit for bit as the CPU's reference dequantizers): one workgroup per id.
#include "common.glsl"
#include "dequant.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  U16 table;
  I32 ids;  // [n_ids]
  F32 y;    // [n_ids, n_cols]
  uint n_cols;
  uint n_ids;
} p;

void main() {
  const uint i = group_index();
  if (i >= p.n_ids) return;
  const uint row = row_start(uint(p.ids.v[i]), p.n_cols);
  const uint n_groups = (p.n_cols + 31u) / 32u;
  for (uint g = gl_LocalInvocationID.x; g < n_groups; g += 64u) {
    float v[32];
    dq32(p.table, row, g, p.n_cols, v);
    for (uint l = 0u; l < 32u && 32u * g + l < p.n_cols; ++l) p.y.v[i * p.n_cols + 32u * g + l] = v[l];
  }
}
