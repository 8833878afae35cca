#version 450
// softmax.comp: x[r, :] = softmax(x[r, :]) in place: one workgroup per row.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  F32 x;  // [n_rows, n_cols]
  uint n_cols;
  uint n_rows;
} p;

shared float partial[256];

void main() {
  const uint r = group_index();
  if (r >= p.n_rows) return;
  const uint t = gl_LocalInvocationID.x, base = r * p.n_cols;
  float m = -1.0 / 0.0;
  for (uint i = t; i < p.n_cols; i += 256u) m = max(m, p.x.v[base + i]);
  partial[t] = m;
  barrier();
  for (uint h = 128u; h > 0u; h >>= 1) {
    if (t < h) partial[t] = max(partial[t], partial[t + h]);
    barrier();
  }
  m = partial[0];
  barrier();
  float s = 0.0;
  for (uint i = t; i < p.n_cols; i += 256u) {
    const float e = exp(p.x.v[base + i] - m);
    p.x.v[base + i] = e;
    s += e;
  }
  partial[t] = s;
  barrier();
  for (uint h = 128u; h > 0u; h >>= 1) {
    if (t < h) partial[t] += partial[t + h];
    barrier();
  }
  const float inv = 1.0 / partial[0];
  for (uint i = t; i < p.n_cols; i += 256u) p.x.v[base + i] *= inv;
}
