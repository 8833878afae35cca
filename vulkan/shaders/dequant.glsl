// dequant.glsl: one group of 32 consecutive values of a weight row, dequantized exactly as the
// reference dequantizers of quant/ (gguf-py's arithmetic: the integer quant, then one rounded
// multiply, and one rounded add or subtract for types with a minimum; `precise` keeps the
// compiler from fusing them). Compiled once per type, selected by -DTYPE_<name>.
//   row_start(o, n_in): where row o starts, in u16 words (in bytes for mxfp4, whose 17-byte blocks
//   leave odd rows off the u16 grid);  dq32(w, row, g, n_in, v): values 32g .. 32g+31 of the row
//   starting at `row` (values past n_in read as 0: only float types allow n_in not a multiple
//   of 32).

#if defined(TYPE_F32)
uint row_u16(uint n_in) { return 2u * n_in; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    const uint k = 32u * g + l;
    v[l] = k < n_in ? uintBitsToFloat(uint(w.v[row + 2u * k]) | (uint(w.v[row + 2u * k + 1u]) << 16)) : 0.0;
  }
}
#elif defined(TYPE_F16)
uint row_u16(uint n_in) { return n_in; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    const uint k = 32u * g + l;
    v[l] = k < n_in ? f16_to_f32(uint(w.v[row + k])) : 0.0;
  }
}
#elif defined(TYPE_BF16)
uint row_u16(uint n_in) { return n_in; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    const uint k = 32u * g + l;
    v[l] = k < n_in ? uintBitsToFloat(uint(w.v[row + k]) << 16) : 0.0;
  }
}
#elif defined(TYPE_Q4_0) || defined(TYPE_IQ4_NL)
// BlockQ4_0 / BlockIQ4_NL: d (f16), qs[16]; value j is the low nibble of qs[j], j + 16 the high
// one; the nibble is a level q - 8 (q4_0) or an index into the iq4_nl codebook.
#if defined(TYPE_Q4_0)
int level(uint q) { return int(q) - 8; }
#else
const int kIq4nlValues[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
int level(uint q) { return kIq4nlValues[q]; }
#endif
uint row_u16(uint n_in) { return n_in / 32u * 9u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 9u * g;
  const float d = f16_to_f32(uint(w.v[b]));
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    const uint q = byte_at(w, b + 1u, j);
    precise float lo = d * float(level(q & 15u)), hi = d * float(level(q >> 4));
    v[j] = lo;
    v[j + 16u] = hi;
  }
}
#elif defined(TYPE_Q4_1)
uint row_u16(uint n_in) { return n_in / 32u * 10u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 10u * g;
  const float d = f16_to_f32(uint(w.v[b])), m = f16_to_f32(uint(w.v[b + 1u]));
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    const uint q = byte_at(w, b + 2u, j);
    precise float lo = d * float(q & 15u) + m, hi = d * float(q >> 4) + m;
    v[j] = lo;
    v[j + 16u] = hi;
  }
}
#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
#if defined(TYPE_Q5_0)
const uint kBlockU16 = 11u, kQh = 1u;
#else
const uint kBlockU16 = 12u, kQh = 2u;
#endif
uint row_u16(uint n_in) { return n_in / 32u * kBlockU16; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + kBlockU16 * g;
  const float d = f16_to_f32(uint(w.v[b]));
  const uint qh = uint(w.v[b + kQh]) | (uint(w.v[b + kQh + 1u]) << 16);
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    const uint q = byte_at(w, b + kQh + 2u, j);
    const uint lo = (q & 15u) | (((qh >> j) & 1u) << 4), hi = (q >> 4) | (((qh >> (j + 16u)) & 1u) << 4);
#if defined(TYPE_Q5_0)
    precise float a = d * float(int(lo) - 16), c = d * float(int(hi) - 16);
#else
    const float m = f16_to_f32(uint(w.v[b + 1u]));
    precise float a = d * float(lo) + m, c = d * float(hi) + m;
#endif
    v[j] = a;
    v[j + 16u] = c;
  }
}
#elif defined(TYPE_Q8_0)
uint row_u16(uint n_in) { return n_in / 32u * 17u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 17u * g;
  const float d = f16_to_f32(uint(w.v[b]));
  [[unroll]] for (uint j = 0u; j < 32u; ++j) {
    precise float x = d * float(sbyte_at(w, b + 1u, j));
    v[j] = x;
  }
}
#elif defined(TYPE_Q2_K) || defined(TYPE_Q3_K)
// Both keep 2 low bits of element 128h + 32k + l (h < 2, k < 4) at bits 2k, 2k+1 of qs[32h + l]
// and scale sub-blocks of 16 (layouts in quant/blocks.h).
//   BlockQ2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin (f16);
//   BlockQ3_K: hmask[32], qs[64], scales[12] (16 packed 6-bit scales), d (f16).
#if defined(TYPE_Q2_K)
const uint kBlockU16 = 42u, kQs = 8u;
#else
const uint kBlockU16 = 55u, kQs = 16u;
#endif
uint row_u16(uint n_in) { return n_in / 256u * kBlockU16; }
// Values 32r .. 32r+31 of a block: bits 2(r % 4).. of qs[32(r / 4) + l].
uint low_bits(U16 w, uint b, uint r, uint l) {
  return (byte_at(w, b + kQs, 32u * (r / 4u) + l) >> (2u * (r % 4u))) & 3u;
}
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + kBlockU16 * (g / 8u), r = g % 8u;
  [[unroll]] for (uint j = 0u; j < 2u; ++j) {
    const uint s = 2u * r + j;  // the sub-block of 16
#if defined(TYPE_Q2_K)
    const uint sc = byte_at(w, b, s);
    precise float dl = f16_to_f32(uint(w.v[b + 40u])) * float(sc & 15u);
    precise float ml = f16_to_f32(uint(w.v[b + 41u])) * float(sc >> 4);
#else
    const uint low = s < 8u ? byte_at(w, b + 48u, s) & 15u : byte_at(w, b + 48u, s - 8u) >> 4;
    const uint high = (byte_at(w, b + 48u, 8u + s % 4u) >> (2u * (s / 4u))) & 3u;
    precise float dl = f16_to_f32(uint(w.v[b + 54u])) * float(int(low | (high << 4)) - 32);
#endif
    [[unroll]] for (uint i = 0u; i < 16u; ++i) {
      const uint l = 16u * j + i;
#if defined(TYPE_Q2_K)
      precise float x = dl * float(low_bits(w, b, r, l)) - ml;
#else
      const uint hbit = (byte_at(w, b, l) >> r) & 1u;  // clear: the quant is 4 lower
      precise float x = dl * float(int(low_bits(w, b, r, l)) - int(4u - 4u * hbit));
#endif
      v[l] = x;
    }
  }
}
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// BlockQ4_K: d, dmin (f16), scales[12], qs[128]; BlockQ5_K adds qh[32] (bit s of qh[l]: the fifth
// bit of value l of sub-block s) before qs. 8 sub-blocks of 32: value l of sub-block s is nibble
// s % 2 of qs[32(s / 2) + l].
#if defined(TYPE_Q4_K)
const uint kBlockU16 = 72u, kQs = 8u;
#else
const uint kBlockU16 = 88u, kQs = 24u;
#endif
uint row_u16(uint n_in) { return n_in / 256u * kBlockU16; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + kBlockU16 * (g / 8u), s = g % 8u;
  const float d = f16_to_f32(uint(w.v[b])), dmin = f16_to_f32(uint(w.v[b + 1u]));
  uint sc, m;
  if (s < 4u) {
    sc = byte_at(w, b + 2u, s) & 63u;
    m = byte_at(w, b + 2u, s + 4u) & 63u;
  } else {
    sc = (byte_at(w, b + 2u, s + 4u) & 15u) | ((byte_at(w, b + 2u, s - 4u) >> 2) & 48u);
    m = (byte_at(w, b + 2u, s + 4u) >> 4) | ((byte_at(w, b + 2u, s) >> 2) & 48u);
  }
  precise float dl = d * float(sc), ml = dmin * float(m);
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    uint q = (byte_at(w, b + kQs, 32u * (s / 2u) + l) >> (4u * (s % 2u))) & 15u;
#if defined(TYPE_Q5_K)
    q |= ((byte_at(w, b + 8u, l) >> s) & 1u) << 4;
#endif
    precise float x = dl * float(q) - ml;
    v[l] = x;
  }
}
#elif defined(TYPE_Q6_K)
// BlockQ6_K: ql[128], qh[64], scales[16] (int8), d (f16); 16 sub-blocks of 16.
uint row_u16(uint n_in) { return n_in / 256u * 105u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 105u * (g / 8u), r = g % 8u;  // values 32r .. 32r+31 of the block
  const uint h = r / 4u, k = r % 4u;
  const float d = f16_to_f32(uint(w.v[b + 104u]));
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    const uint low = (byte_at(w, b, 64u * h + 32u * (k % 2u) + l) >> (4u * (k / 2u))) & 15u;
    const uint high = (byte_at(w, b, 128u + 32u * h + l) >> (2u * k)) & 3u;
    const int q = int(low | (high << 4)) - 32;
    const uint sub = (32u * r + l) / 16u;
    precise float dl = d * float(sbyte_at(w, b, 192u + sub));
    precise float x = dl * float(q);
    v[l] = x;
  }
}
#elif defined(TYPE_TQ2_0)
// BlockTQ2_0: qs[64], d (f16); the trit t of element 128h + 32k + l is bits 2k, 2k+1 of qs[32h + l]
// (q2_k's layout), x = d * (t - 1).
uint row_u16(uint n_in) { return n_in / 256u * 33u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 33u * (g / 8u), r = g % 8u;
  const float d = f16_to_f32(uint(w.v[b + 32u]));
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    const uint t = (byte_at(w, b, 32u * (r / 4u) + l) >> (2u * (r % 4u))) & 3u;
    precise float x = d * float(int(t) - 1);
    v[l] = x;
  }
}
#elif defined(TYPE_TQ1_0)
// BlockTQ1_0: qs[48], qh[4], d (f16); five (qh: four) base-3 trits per byte, trit n of byte q being
// ((q * 3^n) mod 256 * 3) >> 8. Values 32r .. 32r+31: r < 5, trit r of qs[0..32); r = 5, 6: trits
// 2(r-5), 2(r-5)+1 of qs[32..48); r = 7: trit 4 of qs[32..48), then trit n of qh[l] at 16 + 4n + l.
uint row_u16(uint n_in) { return n_in / 256u * 27u; }
const uint kPow3[5] = uint[5](1u, 3u, 9u, 27u, 81u);
uint trit(uint q, uint n) { return (((q * kPow3[n]) & 255u) * 3u) >> 8; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 27u * (g / 8u), r = g % 8u;
  const float d = f16_to_f32(uint(w.v[b + 26u]));
  [[unroll]] for (uint l = 0u; l < 32u; ++l) {
    uint t;
    if (r < 5u) {
      t = trit(byte_at(w, b, l), r);
    } else if (l < 16u) {
      t = trit(byte_at(w, b, 32u + l), 2u * (r - 5u));
    } else if (r < 7u) {
      t = trit(byte_at(w, b, 16u + l), 2u * (r - 5u) + 1u);
    } else {
      t = trit(byte_at(w, b, 48u + (l - 16u) % 4u), (l - 16u) / 4u);
    }
    precise float x = d * float(int(t) - 1);
    v[l] = x;
  }
}
#elif defined(TYPE_IQ4_XS)
// BlockIQ4_XS: d (f16), scales_h (u16), scales_l[4], qs[128]; sub-block s of 32 has the six-bit
// scale nibble s % 2 of scales_l[s / 2] | bits 2s, 2s+1 of scales_h << 4, x = (d * (sc - 32)) *
// kIq4nlValues[q], value l (16 + l) of the sub-block the low (high) nibble of qs[16s + l].
const int kIq4nlValues[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
uint row_u16(uint n_in) { return n_in / 256u * 68u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 68u * (g / 8u), s = g % 8u;
  const uint low = (byte_at(w, b + 2u, s / 2u) >> (4u * (s % 2u))) & 15u;
  const uint high = (uint(w.v[b + 1u]) >> (2u * s)) & 3u;
  precise float dl = f16_to_f32(uint(w.v[b])) * float(int(low | (high << 4)) - 32);
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    const uint q = byte_at(w, b + 4u, 16u * s + j);
    precise float lo = dl * float(kIq4nlValues[q & 15u]), hi = dl * float(kIq4nlValues[q >> 4]);
    v[j] = lo;
    v[j + 16u] = hi;
  }
}
#elif defined(TYPE_MXFP4)
// BlockMXFP4: e (E8M0), qs[16]; x = 2^(e - 128) * kMxfp4Values[q], nibbles as q4_0's. Rows are
// addressed in bytes (row_start below): a block is 17 bytes.
#define ROW_START_DEFINED
const int kMxfp4Values[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
uint row_start(uint o, uint n_in) { return o * (n_in / 32u * 17u); }
// 2^(e - 128), subnormal for e < 2 (ggml_e8m0_to_fp32_half).
float e8m0_half(uint e) { return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23); }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 17u * g;  // a byte address
  const float d = e8m0_half(byte_at(w, 0u, b));
  [[unroll]] for (uint j = 0u; j < 16u; ++j) {
    const uint q = byte_at(w, 0u, b + 1u + j);
    precise float lo = d * float(kMxfp4Values[q & 15u]), hi = d * float(kMxfp4Values[q >> 4]);
    v[j] = lo;
    v[j + 16u] = hi;
  }
}
#elif defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) || defined(TYPE_IQ3_XXS) || \
    defined(TYPE_IQ3_S) || defined(TYPE_IQ1_S) || defined(TYPE_IQ1_M)
// The grid i-quants (layouts in quant/blocks.h, arithmetic as quant/dequantize_iq.cpp): each group
// of 8 (iq3: 4) values is one codebook row, with signs applied after the scaling (exact), or for
// iq1 x = dl * (row value + delta).
#include "iq_grids.glsl"
// Value j of row i of an 8-wide grid, unsigned (iq2) or as its int8 (iq1).
#define GRID8(grid, i, j) ((grid[2u * (i) + (j) / 4u] >> (8u * ((j) % 4u))) & 255u)
#define GRID4(grid, i, j) ((grid[i] >> (8u * (j))) & 255u)
uint u32_at(U16 w, uint base) { return uint(w.v[base]) | (uint(w.v[base + 1u]) << 16); }
// db * value, negated when the sign bit is set.
float signed_value(float db, uint value, uint sign) {
  precise float x = db * float(value);
  return sign != 0u ? -x : x;
}
float half_step_scale(float d, uint s, float factor) {
  precise float x = d * (0.5 + float(s)) * factor;
  return x;
}
#if defined(TYPE_IQ2_XXS)
// BlockIQ2_XXS: d, qs[32] (u16); block ib: u32 words grid = qs[4ib..], aux = qs[4ib + 2..].
uint row_u16(uint n_in) { return n_in / 256u * 33u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 33u * (g / 8u), ib = g % 8u;
  const uint grid = u32_at(w, b + 1u + 4u * ib), aux = u32_at(w, b + 3u + 4u * ib);
  const float db = half_step_scale(f16_to_f32(uint(w.v[b])), aux >> 28, 0.25);
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint i = (grid >> (8u * l)) & 255u, signs = kIqSigns[(aux >> (7u * l)) & 127u];
    [[unroll]] for (uint j = 0u; j < 8u; ++j) v[8u * l + j] = signed_value(db, GRID8(kIq2xxsGrid, i, j), (signs >> j) & 1u);
  }
}
#elif defined(TYPE_IQ2_XS)
// BlockIQ2_XS: d, qs[32] (u16: 9-bit row, 7-bit sign index), scales[8] at byte 66.
uint row_u16(uint n_in) { return n_in / 256u * 37u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 37u * (g / 8u), ib = g % 8u;
  const float d = f16_to_f32(uint(w.v[b]));
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint k = 4u * ib + l, q = uint(w.v[b + 1u + k]);
    const float db = half_step_scale(d, (byte_at(w, b + 33u, k / 4u) >> (4u * ((k / 2u) % 2u))) & 15u, 0.25);
    const uint i = q & 511u, signs = kIqSigns[q >> 9];
    [[unroll]] for (uint j = 0u; j < 8u; ++j) v[8u * l + j] = signed_value(db, GRID8(kIq2xsGrid, i, j), (signs >> j) & 1u);
  }
}
#elif defined(TYPE_IQ2_S)
// BlockIQ2_S: d, qs[32], signs[32], qh[8], scales[8] (bytes from 2).
uint row_u16(uint n_in) { return n_in / 256u * 41u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 41u * (g / 8u), ib = g % 8u;
  const float d = f16_to_f32(uint(w.v[b]));
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint k = 4u * ib + l;
    const float db = half_step_scale(d, (byte_at(w, b + 1u, 72u + k / 4u) >> (4u * ((k / 2u) % 2u))) & 15u, 0.25);
    const uint i = byte_at(w, b + 1u, k) | (((byte_at(w, b + 1u, 64u + k / 4u) >> (2u * (k % 4u))) & 3u) << 8);
    const uint signs = byte_at(w, b + 1u, 32u + k);
    [[unroll]] for (uint j = 0u; j < 8u; ++j) v[8u * l + j] = signed_value(db, GRID8(kIq2sGrid, i, j), (signs >> j) & 1u);
  }
}
#elif defined(TYPE_IQ3_XXS)
// BlockIQ3_XXS: d, qs[64] grid indices, then 8 u32 scale-and-signs words (u16 word 33 on).
uint row_u16(uint n_in) { return n_in / 256u * 49u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 49u * (g / 8u), ib = g % 8u;
  const uint aux = u32_at(w, b + 33u + 2u * ib);
  const float db = half_step_scale(f16_to_f32(uint(w.v[b])), aux >> 28, 0.5);
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint signs = kIqSigns[(aux >> (7u * l)) & 127u];
    const uint i0 = byte_at(w, b + 1u, 8u * ib + 2u * l), i1 = byte_at(w, b + 1u, 8u * ib + 2u * l + 1u);
    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
      v[8u * l + j] = signed_value(db, GRID4(kIq3xxsGrid, i0, j), (signs >> j) & 1u);
      v[8u * l + 4u + j] = signed_value(db, GRID4(kIq3xxsGrid, i1, j), (signs >> (4u + j)) & 1u);
    }
  }
}
#elif defined(TYPE_IQ3_S)
// BlockIQ3_S: d, qs[64], qh[8], signs[32], scales[4] (bytes from 2).
uint row_u16(uint n_in) { return n_in / 256u * 55u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 55u * (g / 8u), ib = g % 8u;
  const uint s = (byte_at(w, b + 1u, 104u + ib / 2u) >> (4u * (ib % 2u))) & 15u;
  precise float db = f16_to_f32(uint(w.v[b])) * float(1u + 2u * s);
  const uint qh = byte_at(w, b + 1u, 64u + ib);
  [[unroll]] for (uint m = 0u; m < 8u; ++m) {
    const uint k = 8u * ib + m;
    const uint i = byte_at(w, b + 1u, k) | (((qh >> m) & 1u) << 8);
    const uint signs = byte_at(w, b + 1u, 72u + k / 2u) >> (4u * (k % 2u));
    [[unroll]] for (uint j = 0u; j < 4u; ++j) v[4u * m + j] = signed_value(db, GRID4(kIq3sGrid, i, j), (signs >> j) & 1u);
  }
}
#else  // iq1_s, iq1_m
// The int8 value -1, 0 or 1 of a grid row plus delta, scaled.
float iq1_value(float dl, uint byte, float delta) {
  precise float x = dl * (float(int(byte) - int((byte & 0x80u) << 1)) + delta);
  return x;
}
#if defined(TYPE_IQ1_S)
// BlockIQ1_S: d, qs[32] (bytes from 2), qh[8] (u16 words from 17).
uint row_u16(uint n_in) { return n_in / 256u * 25u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 25u * (g / 8u), ib = g % 8u;
  const uint h = uint(w.v[b + 17u + ib]);
  precise float dl = f16_to_f32(uint(w.v[b])) * float(2u * ((h >> 12) & 7u) + 1u);
  const float delta = (h & 0x8000u) != 0u ? -0.125 : 0.125;
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint i = byte_at(w, b + 1u, 4u * ib + l) | (((h >> (3u * l)) & 7u) << 8);
    [[unroll]] for (uint j = 0u; j < 8u; ++j) v[8u * l + j] = iq1_value(dl, GRID8(kIq1sGrid, i, j), delta);
  }
}
#else
// BlockIQ1_M: qs[32], qh[16], scales (four u16 words from word 24, d's f16 in their top nibbles).
uint row_u16(uint n_in) { return n_in / 256u * 28u; }
void dq32(U16 w, uint row, uint g, uint n_in, out float v[32]) {
  const uint b = row + 28u * (g / 8u), ib = g % 8u;
  uint sc[4];
  [[unroll]] for (uint i = 0u; i < 4u; ++i) sc[i] = uint(w.v[b + 24u + i]);
  const uint d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0u) | ((sc[2] >> 4) & 0xf00u) | (sc[3] & 0xf000u);
  const float d = f16_to_f32(d_bits);
  [[unroll]] for (uint l = 0u; l < 4u; ++l) {
    const uint k = 4u * ib + l, g16 = k / 2u;
    precise float dl = d * float(2u * ((sc[g16 / 4u] >> (3u * (g16 % 4u))) & 7u) + 1u);
    const uint nib = (byte_at(w, b, 32u + k / 2u) >> (4u * (k % 2u))) & 15u;
    const uint i = byte_at(w, b, k) | ((nib & 7u) << 8);
    const float delta = (nib & 8u) != 0u ? -0.125 : 0.125;
    [[unroll]] for (uint j = 0u; j < 8u; ++j) v[8u * l + j] = iq1_value(dl, GRID8(kIq1sGrid, i, j), delta);
  }
}
#endif
#endif
#else
#error "dequant.glsl: no TYPE_ defined"
#endif

#if !defined(ROW_START_DEFINED)
uint row_start(uint o, uint n_in) { return o * row_u16(n_in); }
#endif
