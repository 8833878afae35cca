#version 450
// rms_norm.comp: y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight: one workgroup per row.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  F32 x;       // [n_rows, n_cols]
  F32 weight;  // [n_cols]
  F32 y;       // [n_rows, n_cols], may alias x
  uint n_cols;
  uint n_rows;
  float eps;
} p;

shared float partial[256];

void main() {
  const uint r = group_index();
  if (r >= p.n_rows) return;
  const uint t = gl_LocalInvocationID.x, base = r * p.n_cols;
  float s = 0.0;
  for (uint i = t; i < p.n_cols; i += 256u) {
    const float v = p.x.v[base + i];
    s += v * v;
  }
  partial[t] = s;
  barrier();
  for (uint h = 128u; h > 0u; h >>= 1) {
    if (t < h) partial[t] += partial[t + h];
    barrier();
  }
  const float inv_rms = 1.0 / sqrt(partial[0] / float(p.n_cols) + p.eps);
  for (uint i = t; i < p.n_cols; i += 256u) {
    precise float v = p.x.v[base + i] * inv_rms;
    p.y.v[base + i] = v * p.weight.v[i];
  }
}
