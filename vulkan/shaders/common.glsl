// common.glsl: what every ember compute shader shares — buffers reached through 64-bit device
// addresses in push constants (no descriptor sets), exact f16 <-> f32 conversion, and the flat
// index of a workgroup in a 2-D grid (the host splits dispatches over 65535 groups into rows).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16 { uint16_t v[]; };

uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// cap * tanh(x / cap) (logit soft-capping), from exp(-2|u|) <= 1 so that no large |x| overflows.
float softcap(float x, float cap) {
  const float t = exp(-2.0 * abs(x / cap));
  return cap * sign(x) * (1.0 - t) / (1.0 + t);
}

// IEEE binary16 -> float32, exactly (subnormals included), in integer arithmetic.
float f16_to_f32(uint h) {
  const uint s = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1fu;
  const uint m = h & 0x3ffu;
  if (e == 0u) {
    const float mag = float(m) * 5.9604644775390625e-8;  // m * 2^-24, exact
    return s != 0u ? -mag : mag;
  }
  if (e == 31u) return uintBitsToFloat(s | 0x7f800000u | (m << 13));
  return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

// float32 -> IEEE binary16, rounding to nearest even (as F16C and the CPU backend do).
uint f32_to_f16(float f) {
  const uint x = floatBitsToUint(f);
  const uint s = (x >> 16) & 0x8000u;
  const uint e = (x >> 23) & 0xffu;
  uint m = x & 0x7fffffu;
  if (e == 255u) return s | 0x7c00u | (m != 0u ? 0x200u | (m >> 13) : 0u);
  const int he = int(e) - 112;  // the binary16 exponent field
  if (he >= 31) return s | 0x7c00u;
  if (he <= 0) {  // subnormal (or zero) result
    if (he < -10) return s;
    m |= 0x800000u;
    const uint shift = uint(14 - he);
    uint hm = m >> shift;
    const uint rem = m & ((1u << shift) - 1u);
    const uint half_ulp = 1u << (shift - 1u);
    if (rem > half_ulp || (rem == half_ulp && (hm & 1u) != 0u)) hm += 1u;
    return s | hm;
  }
  uint h = s | (uint(he) << 10) | (m >> 13);
  const uint rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;  // may carry into the exponent
  return h;
}

// Byte j of the 2-byte aligned data starting at u16 index base.
uint byte_at(U16 p, uint base, uint j) {
  const uint w = uint(p.v[base + (j >> 1)]);
  return (j & 1u) != 0u ? (w >> 8) : (w & 0xffu);
}
int sbyte_at(U16 p, uint base, uint j) {
  const uint b = byte_at(p, base, j);
  return int(b) - int((b & 0x80u) << 1);
}
