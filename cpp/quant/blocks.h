// quant/blocks.h: the byte layout of every quantized block ggml defines that ember reads or
// writes, and the scalar f16/bf16 <-> f32 conversions. Layouts only: no behaviour lives here, so
// SIMD kernels in cpu/ can include it freely. Sizes are checked against ggml's (see types.cpp).
//
// Every half-precision scale is stored as its raw IEEE binary16 bits (uint16_t) so the structs
// are plain, trivially copyable and identical on every compiler; convert with f16_to_f32().
// All multi-byte fields are little-endian, as in GGUF files.
#pragma once

#include <bit>
#include <cstdint>

namespace ember {

// Block fields are read in place, so the host must share GGUF's byte order.
static_assert(std::endian::native == std::endian::little, "ember reads GGUF blocks in place");

inline constexpr int kQK = 32;           // elements per block of the legacy types (q4_0 ... q8_1, iq4_nl)
inline constexpr int kQK_K = 256;        // elements per super-block of the k-quants and iq4_xs
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales+mins of q4_k / q5_k

// ---- legacy 32-element blocks ------------------------------------------------------------------

// x[i] = d * (q[i] - 8); q[i] = qs[i] & 15 for i < 16, qs[i - 16] >> 4 for i >= 16.
struct BlockQ4_0 {
  uint16_t d;           // f16 scale
  uint8_t qs[kQK / 2];  // 4-bit quants: element i in the low nibble, i + 16 in the high nibble
};
static_assert(sizeof(BlockQ4_0) == 18);

// x[i] = d * q[i] + m, nibbles as in BlockQ4_0.
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 minimum (offset)
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// x[i] = d * (q[i] - 16); q[i] = low nibble as in BlockQ4_0 | bit i of qh (little-endian u32) << 4.
struct BlockQ5_0 {
  uint16_t d;           // f16 scale
  uint8_t qh[4];        // fifth bits, element i at bit i of the little-endian uint32
  uint8_t qs[kQK / 2];  // low 4 bits, nibbles as in BlockQ4_0
};
static_assert(sizeof(BlockQ5_0) == 22);

// x[i] = d * q[i] + m, bits as in BlockQ5_0.
struct BlockQ5_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 minimum (offset)
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Activation block for dot products with q4_1/q5_1: x[i] = d * qs[i], s = d * sum(qs).
struct BlockQ8_1 {
  uint16_t d;  // f16 scale
  uint16_t s;  // f16 d * sum(qs), saves the min term of the dot product
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_1) == 36);

// x[i] = d * kIq4nlValues[q[i]], nibbles as in BlockQ4_0.
struct BlockIQ4_NL {
  uint16_t d;           // f16 scale
  uint8_t qs[kQK / 2];  // 4-bit indices into kIq4nlValues
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// The non-linear 4-bit codebook of iq4_nl and iq4_xs (denser near zero, like a normal weight
// distribution).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// ---- 256-element super-blocks -------------------------------------------------------------------

// 16 sub-blocks of 16: x = (d * (sc & 15)) * q - dmin * (sc >> 4), q 2 bits.
// Element 128*h + 32*k + l (h < 2, k < 4, l < 32) is bits 2k..2k+1 of qs[32*h + l].
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per sub-block: low nibble scale, high nibble min
  uint8_t qs[kQK_K / 4];       // 2-bit quants
  uint16_t d;                  // f16 super-block scale of the scales
  uint16_t dmin;               // f16 super-block scale of the mins
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16: x = (d * (s - 32)) * (q - (hbit ? 0 : 4)), q 2 low bits as in BlockQ2_K,
// hbit of element 32*k + l (k < 8) is bit k of hmask[l]. The 16 6-bit scales s: low 4 bits of
// scale j are the low (j < 8) or high (j >= 8) nibble of scales[j % 8]; high 2 bits are bits
// 2*(j/4)..+1 of scales[8 + j % 4].
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // high bits, set means no -4 offset
  uint8_t qs[kQK_K / 4];     // low 2 bits
  uint8_t scales[12];        // 16 packed 6-bit scales
  uint16_t d;                // f16 super-block scale
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32: x = (d * sc) * q - dmin * m, q 4 bits: element 64*j + 32*h + l is nibble h
// of qs[32*j + l]. Six-bit sc/m of sub-block i < 4: scales[i] & 63, scales[i + 4] & 63; of
// i >= 4: (scales[i + 4] & 15) | (scales[i - 4] >> 6) << 4, (scales[i + 4] >> 4) | (scales[i] >> 6) << 4.
struct BlockQ4_K {
  uint16_t d;     // f16 super-block scale of the scales
  uint16_t dmin;  // f16 super-block scale of the mins
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As BlockQ4_K with a fifth bit: bit i of qh[l] is the high bit of element 32*i + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16: x = (d * scales[i / 16]) * (q - 32), q 6 bits. Element 128*h + r
// (h < 2, r < 128): low 4 bits are nibble r / 64 of ql[64*h + r % 64], high 2 bits are bits
// 2*(r / 32)..+1 of qh[32*h + r % 32].
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];  // signed 8-bit sub-block scales
  uint16_t d;                 // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// Activation block for dot products with the k-quants: x[i] = d * qs[i].
struct BlockQ8_K {
  float d;  // f32 scale (not f16)
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sums of each 16 quants, for the min terms
};
static_assert(sizeof(BlockQ8_K) == 292);

// 8 sub-blocks of 32: x = (d * (s - 32)) * kIq4nlValues[q]. Six-bit s of sub-block i: low 4 bits
// nibble i % 2 of scales_l[i / 2], high 2 bits bits 2i..2i+1 of scales_h. Element 16*h + l of
// sub-block i is nibble h of qs[16*i + l].
struct BlockIQ4_XS {
  uint16_t d;                    // f16 super-block scale
  uint16_t scales_h;             // high 2 bits of the 8 sub-block scales
  uint8_t scales_l[kQK_K / 64];  // low 4 bits of the 8 sub-block scales
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Ternary: x = d * (t - 1), t in {0, 1, 2} two bits each. Element 128*h + 32*k + l (h < 2,
// k < 4, l < 32) is bits 2k..2k+1 of qs[32*h + l] (the layout of BlockQ2_K's quants).
struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];
  uint16_t d;  // f16 scale
};
static_assert(sizeof(BlockTQ2_0) == 66);

// Ternary, five trits per byte: x = d * (t - 1). A byte q holds trit n (n < 5, or n < 4 in qh) as
// t = ((uint8_t)(q * 3^n) * 3) >> 8 (the byte is a base-3 fraction scaled to 256). Element
// 32*n + l is trit n of qs[l] (l < 32); 160 + 16*n + l is trit n of qs[32 + l] (l < 16);
// 240 + 4*n + l is trit n of qh[l] (l < 4).
struct BlockTQ1_0 {
  uint8_t qs[48];
  uint8_t qh[kQK_K / 64];
  uint16_t d;  // f16 scale
};
static_assert(sizeof(BlockTQ1_0) == 54);

// Microscaling FP4 (OCP MX): x = 2^(e - 128) * kMxfp4Values[q], q the nibbles as in BlockQ4_0.
// kMxfp4Values are the E2M1 values doubled, hence the extra halving of the E8M0 scale.
struct BlockMXFP4 {
  uint8_t e;            // E8M0 scale exponent
  uint8_t qs[kQK / 2];  // 4-bit E2M1 codes
};
static_assert(sizeof(BlockMXFP4) == 17);

inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as f32, as ggml's ggml_e8m0_to_fp32_half: subnormal for e < 2; e = 255 gives
// 2^127 (ggml reads no NaN encoding).
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

// The trit n of byte q in BlockTQ1_0's packing.
inline int tq1_trit(uint8_t q, int n) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t shifted = static_cast<uint8_t>(q * kPow3[n]);
  return (shifted * 3) >> 8;
}

// ---- i-quants: codebook (grid) entries of 4 or 8 values, in quant/iq_grids.h -------------------
// In every type, 32-element block ib (or 16-element group g) has a scale from d; each group of 8
// (or 4) elements is one grid row, and signs flip single elements (kIqSigns expands a 7-bit sign
// index to 8 sign bits).

// Block ib: u32 pair (a, b) = qs[4ib .. 4ib + 4): byte l of a is the kIq2xxsGrid row of elements
// 8l..8l+7, bits 7l..7l+6 of b their sign index, b >> 28 the scale s: d * (0.5 + s) * 0.25.
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// qs[k] for elements 8k..8k+7: low 9 bits the kIq2xsGrid row, high 7 the sign index. 16-element
// group g has scale nibble g % 2 of scales[g / 2]: d * (0.5 + s) * 0.25.
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// Elements 8k..8k+7: kIq2sGrid row qs[k] | bits 2(k%4)..+1 of qh[k/4] << 8, sign bit j of
// signs[k]; scales as BlockIQ2_XS.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint8_t signs[kQK_K / 8];
  uint8_t qh[kQK_K / 32];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_S) == 82);

// Elements 4k..4k+3: kIq3xxsGrid row qs[k]. Block ib: u32 b = bytes 64 + 4ib .. of the block
// (sign indices and scale as BlockIQ2_XXS's b), scale d * (0.5 + s) * 0.5.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[3 * kQK_K / 8];  // 64 grid indices, then 8 u32 scale-and-signs words
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// Elements 4k..4k+3: kIq3sGrid row qs[k] | bit k%8 of qh[k/8] << 8; sign of element i: bit i%8
// of signs[i/8]; block ib scale nibble ib % 2 of scales[ib / 2]: d * (1 + 2s).
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t signs[kQK_K / 8];
  uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// x = dl * (grid + delta), grid values -1/0/1. Block ib, h = qh[ib]: elements 32ib + 8l + j
// use kIq1sGrid row qs[4ib + l] | bits 3l..3l+2 of h << 8; dl = d * (2 * (h >> 12 & 7) + 1);
// delta = -0.125 if h bit 15 else 0.125.
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_S) == 50);

// As BlockIQ1_S, per 8 elements k: nibble k % 2 of qh[k / 2] gives the row's high 3 bits and (bit
// 3) delta's sign; 16-element group g = 4i + t has dl = d * (2 * (scales_u16[i] >> 3t & 7) + 1).
// d's f16 bits are the top nibbles of the four u16 scale words, word 0 lowest.
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];  // four little-endian u16 words
};
static_assert(sizeof(BlockIQ1_M) == 56);

inline constexpr float kIq1Delta = 0.125f;

// ---- scalar float conversions -------------------------------------------------------------------
// These match numpy's float16 casts bit for bit (which gguf-py uses), NaN payloads included:
// numpy keeps a NaN's top payload bits and does not quiet signalling NaNs.

// Exact: every f16 value, subnormals and NaN payloads included, is an f32 value. Branch-free
// (masks, no selects) so that loops over it vectorize.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7fffu;
  const uint32_t inf_nan_mask = 0u - static_cast<uint32_t>(magnitude >= 0x7c00u);
  const uint32_t subnormal_mask = 0u - static_cast<uint32_t>(magnitude < 0x0400u);
  // Normal: exponent rebiased from 15 to 127; inf/NaN: exponent 31 -> 255, payload kept.
  const uint32_t normal = (magnitude << 13) + (112u << 23) + (inf_nan_mask & (112u << 23));
  // Subnormal (and zero): mantissa * 2^-24, exact in f32.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(magnitude)) *
                                                     0x1p-24f);
  return std::bit_cast<float>(sign | (normal & ~subnormal_mask) | (subnormal & subnormal_mask));
}

// IEEE round-to-nearest-even; overflow gives inf; a NaN keeps its top 10 payload bits (and stays
// a NaN if they are all zero), as numpy's npy_floatbits_to_halfbits does.
inline uint16_t f32_to_f16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t f_exp = f & 0x7f800000u;
  const uint32_t f_sig = f & 0x007fffffu;
  if (f_exp == 0x7f800000u) {
    if (f_sig == 0) return sign | 0x7c00u;  // inf
    const uint16_t nan = static_cast<uint16_t>(0x7c00u + (f_sig >> 13));
    return sign | (nan == 0x7c00u ? 0x7c01u : nan);
  }
  if (f_exp >= 0x47800000u) return sign | 0x7c00u;  // |value| >= 65536: inf
  if (f_exp <= 0x38000000u) {
    // Result is a subnormal half or zero: below 2^-25 everything rounds to zero.
    if (f_exp < 0x33000000u) return sign;
    const uint32_t e = f_exp >> 23;            // 102 ..= 112
    const uint32_t shift = 113 - e + 13;       // 14 ..= 24 bits drop out
    const uint32_t sig = 0x00800000u | f_sig;  // implicit bit made explicit
    const uint32_t kept = sig >> shift;
    const uint32_t rest = sig & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    // A carry out of the subnormal range correctly lands on the smallest normal.
    const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent, round the 13 dropped bits; a carry may reach inf, as it should.
  const uint32_t h_exp = (f_exp - 0x38000000u) >> 13;
  const uint32_t rest = f_sig & 0x1fffu;
  const uint32_t kept = f_sig >> 13;
  const uint32_t round_up = (rest > 0x1000u || (rest == 0x1000u && (kept & 1))) ? 1 : 0;
  return static_cast<uint16_t>(sign | (h_exp + kept + round_up));
}

// Exact: bf16 is the top half of an f32.
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// As gguf-py (and ggml_compute_fp32_to_bf16): NaNs become quiet NaNs keeping their top payload
// bits, everything else rounds to nearest even (overflow goes to inf).
inline uint16_t f32_to_bf16(float value) {
  uint32_t n = std::bit_cast<uint32_t>(value);
  if ((n & 0x7fffffffu) > 0x7f800000u) n = (n & 0xffff0000u) | (64u << 16);
  return static_cast<uint16_t>((static_cast<uint64_t>(n) + (0x7fffu + ((n >> 16) & 1))) >> 16);
}

}  // namespace ember
