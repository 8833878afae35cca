#version 450
// layer_norm.comp: y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias (LayerNorm, the
// population variance, from the mean-centred values): one workgroup per row.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  F32 x;       // [n_rows, n_cols]
  F32 weight;  // [n_cols]
  F32 bias;    // [n_cols]
  F32 y;       // [n_rows, n_cols], may alias x
  uint n_cols;
  uint n_rows;
  float eps;
} p;

shared float partial[256];

// The sum over the workgroup of each invocation's s (every invocation gets it).
float group_sum(float s) {
  const uint t = gl_LocalInvocationID.x;
  partial[t] = s;
  barrier();
  for (uint h = 128u; h > 0u; h >>= 1) {
    if (t < h) partial[t] += partial[t + h];
    barrier();
  }
  const float total = partial[0];
  barrier();  // partial is written again by the next sum
  return total;
}

void main() {
  const uint r = group_index();
  if (r >= p.n_rows) return;
  const uint t = gl_LocalInvocationID.x, base = r * p.n_cols;
  float s = 0.0;
  for (uint i = t; i < p.n_cols; i += 256u) s += p.x.v[base + i];
  const float mean = group_sum(s) / float(p.n_cols);
  float s2 = 0.0;
  for (uint i = t; i < p.n_cols; i += 256u) {
    const float d = p.x.v[base + i] - mean;
    s2 += d * d;
  }
  const float inv_std = 1.0 / sqrt(group_sum(s2) / float(p.n_cols) + p.eps);
  for (uint i = t; i < p.n_cols; i += 256u) {
    precise float v = (p.x.v[base + i] - mean) * inv_std;
    p.y.v[base + i] = v * p.weight.v[i] + p.bias.v[i];
  }
}
