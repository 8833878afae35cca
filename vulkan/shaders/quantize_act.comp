#version 450
// quantize_act.comp: x[n_rows, n_in] rounded to 8 bits per block of 32 values, as the CPU
// backend quantizes activations for quantized weights (cpu/quantize_act.cpp: d = amax / 127,
// q = round-to-even(x / d)), written back as the f32 values d * q: matmuls with quantized
// weights then see the activations the CPU sees. One invocation per block.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
  F32 x;  // [n_rows, n_in]
  F32 y;  // [n_rows, n_in]
  uint n_blocks;  // n_rows * n_in / 32
} p;

void main() {
  const uint b = group_index() * 64u + gl_LocalInvocationID.x;
  if (b >= p.n_blocks) return;
  float amax = 0.0;
  for (uint l = 0u; l < 32u; ++l) amax = max(amax, abs(p.x.v[32u * b + l]));
  const float d = amax / 127.0;
  const float id = d != 0.0 ? 1.0 / d : 0.0;
  for (uint l = 0u; l < 32u; ++l) {
    precise float q = roundEven(p.x.v[32u * b + l] * id);
    precise float v = q * d;
    p.y.v[32u * b + l] = v;
  }
}
