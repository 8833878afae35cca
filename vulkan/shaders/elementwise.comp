#version 450
// elementwise.comp: the f32 ops of one pass over n values, chosen by `op`:
//   0 add:      y = a + b          1 add_bias: y[i] = a[i] + b[i % n_cols]
//   2 silu_mul: y = silu(a) * b    3 gelu_mul: y = gelu_tanh(a) * b      4 scale: y = a * s
//   5 softcap:  y = s * tanh(a / s)  6 gelu:     y = 0.5 a (1 + erf(a / sqrt(2))) (exact; BERT's, the ViTs')
#include "common.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  F32 a;
  F32 b;
  F32 y;
  uint n;
  uint n_cols;
  uint op;
  float s;
} p;

// erf(x) by Abramowitz & Stegun 7.1.26 (GLSL has none): absolute error under 1.5e-7, an f32 ulp
// of values near 1, so gelu matches the CPU's std::erf to f32 rounding.
float erf_approx(float x) {
  const float t = 1.0 / (1.0 + 0.3275911 * abs(x));
  const float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(x) * (1.0 - poly * exp(-x * x));
}

void main() {
  const uint i = group_index() * 256u + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const float a = p.a.v[i];
  float y;
  if (p.op == 0u) {
    y = a + p.b.v[i];
  } else if (p.op == 1u) {
    y = a + p.b.v[i % p.n_cols];
  } else if (p.op == 2u) {
    y = a / (1.0 + exp(-a)) * p.b.v[i];
  } else if (p.op == 3u) {
    // 0.5 a (1 + tanh(u)) = a / (1 + exp(-2u)): the same value without tanh's cancellation.
    const float u = 0.7978845608028654 * a * (1.0 + 0.044715 * a * a);
    y = a / (1.0 + exp(-2.0 * u)) * p.b.v[i];
  } else if (p.op == 4u) {
    y = a * p.s;
  } else if (p.op == 6u) {
    y = 0.5 * a * (1.0 + erf_approx(a * 0.7071067811865476));
  } else {
    y = softcap(a, p.s);
  }
  p.y.v[i] = y;
}
