// cpu/block_formats.h: how the matmul kernels read each quantized weight type: one 32-element
// block at a time, as 32 unsigned integers u = q + kBias and per-16-element scales and mins, so
// that weight[i] = scale[i / 16] * (u[i] - kBias) + min[i / 16]. Every kernel (scalar reference,
// SIMD dot products, GEMM panel packing) is written against this one description, and the SIMD
// files only replace quants() with a vectorized twin.
//
// Everything here has internal linkage on purpose: this header is compiled into files built with
// different ISA flags, and an inline function shared across them could be merged by the linker
// into a copy that uses instructions the running CPU lacks.
#pragma once

#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_grids.h"
#include "quant/types.h"

namespace ember::cpu {
namespace {

// Per-16-element scale and min of one 32-element block (both halves equal for types whose
// sub-blocks are 32 or more elements long).
struct BlockScales {
  float scale[2];
  float min[2];
};

// Sixth bits of q4_k / q5_k scales: see BlockQ4_K.
inline void k4_scale_min(const uint8_t* scales, int i, int* sc, int* m) {
  if (i < 4) {
    *sc = scales[i] & 63;
    *m = scales[i + 4] & 63;
  } else {
    *sc = (scales[i + 4] & 0x0f) | ((scales[i - 4] >> 2) & 0x30);
    *m = (scales[i + 4] >> 4) | ((scales[i] >> 2) & 0x30);
  }
}

// f16 bits -> f32, through the F16C instruction in files compiled with it (exact either way).
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

inline void set_scales(BlockScales* s, float scale, float min) {
  s->scale[0] = s->scale[1] = scale;
  s->min[0] = s->min[1] = min;
}

// Scale and min of 32-element block j of a q4_k / q5_k super-block with scales d, dmin.
inline void k4_scales(const uint8_t* scales, int j, float d, float dmin, BlockScales* s) {
  int sc, m;
  k4_scale_min(scales, j, &sc, &m);
  set_scales(s, d * static_cast<float>(sc), -(dmin * static_cast<float>(m)));
}

// Each format: Block (the GGUF struct), kBlocksPer (32-element blocks per Block), kBias,
// kMaxU (largest u), kSub16 (halves have different scales), scales(), quants(), and
// scales_all(row, i, s[kBlocksPer]) = the scales of every 32-element block of Block i (the
// super-block scales decoded once). `b` counts 32-element blocks from the start of the row.

// The one-scale types' scales: the block's d (times u - kBias) and, kHasMin, its min m.
template <typename B, bool kHasMin>
struct OneScale {
  using Block = B;
  static constexpr int kBlocksPer = 1;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b];
    if constexpr (kHasMin) {
      set_scales(s, half_to_float(x.d), half_to_float(x.m));
    } else {
      set_scales(s, half_to_float(x.d), 0.0f);
    }
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
};

// The K-quant types' scales: Derived::one(x, j, d, dmin, s) of 32-block j of super-block x, with
// the super-block's d and dmin (0 where the type has no mins) decoded once for scales_all.
template <typename Derived, typename B>
struct SuperScales {
  using Block = B;
  static constexpr int kBlocksPer = 8;
  static float dmin_of(const Block& x) {
    if constexpr (requires(const Block& block) { block.dmin; }) {
      return half_to_float(x.dmin);
    } else {
      return 0.0f;
    }
  }
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    Derived::one(x, static_cast<int>(b % 8), half_to_float(x.d), dmin_of(x), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d), dmin = dmin_of(x);
    for (int j = 0; j < 8; ++j) Derived::one(x, j, d, dmin, &s[j]);
  }
};

// u[32] of a block of 4-bit quants: low nibbles of qs[0..16) then high nibbles, plus, with qh,
// bit l of the 32-bit qh as u[l]'s fifth bit.
inline void nibble_quants(const uint8_t* qs, uint8_t u[32]) {
  for (int l = 0; l < 16; ++l) {
    u[l] = qs[l] & 15;
    u[l + 16] = qs[l] >> 4;
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  return p[0] | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline void five_bit_quants(const uint8_t* qs, const uint8_t* qh_bytes, uint8_t u[32]) {
  const uint32_t qh = load_u32(qh_bytes);
  for (int l = 0; l < 16; ++l) {
    u[l] = (qs[l] & 15) | ((qh >> l) & 1) << 4;
    u[l + 16] = (qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4;
  }
}

struct FormatQ4_0 : OneScale<BlockQ4_0, false> {
  static constexpr int kBias = 8, kMaxU = 15;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    nibble_quants(static_cast<const Block*>(row)[b].qs, u);
  }
};

struct FormatQ4_1 : OneScale<BlockQ4_1, true> {
  static constexpr int kBias = 0, kMaxU = 15;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    nibble_quants(static_cast<const Block*>(row)[b].qs, u);
  }
};

struct FormatQ5_0 : OneScale<BlockQ5_0, false> {
  static constexpr int kBias = 16, kMaxU = 31;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    five_bit_quants(x.qs, x.qh, u);
  }
};

struct FormatQ5_1 : OneScale<BlockQ5_1, true> {
  static constexpr int kBias = 0, kMaxU = 31;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    five_bit_quants(x.qs, x.qh, u);
  }
};

struct FormatQ8_0 : OneScale<BlockQ8_0, false> {
  static constexpr int kBias = 128, kMaxU = 255;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 32; ++l) u[l] = static_cast<uint8_t>(x.qs[l] + 128);
  }
};

struct FormatIQ4_NL : OneScale<BlockIQ4_NL, false> {
  static constexpr int kBias = 128, kMaxU = 255;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 16; ++l) {
      u[l] = static_cast<uint8_t>(kIq4nlValues[x.qs[l] & 15] + 128);
      u[l + 16] = static_cast<uint8_t>(kIq4nlValues[x.qs[l] >> 4] + 128);
    }
  }
};

// iq4_xs: iq4_nl's codebook (+ 128) under 32-block scales d * (s - 32), s six bits (BlockIQ4_XS).
struct FormatIQ4_XS : SuperScales<FormatIQ4_XS, BlockIQ4_XS> {
  static constexpr int kBias = 128, kMaxU = 255;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    const int low = (x.scales_l[j / 2] >> (4 * (j % 2))) & 15, high = (x.scales_h >> (2 * j)) & 3;
    set_scales(s, d * static_cast<float>((low | high << 4) - 32), 0.0f);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const uint8_t* qs = static_cast<const Block*>(row)[b / 8].qs + 16 * (b % 8);
    for (int l = 0; l < 16; ++l) {
      u[l] = static_cast<uint8_t>(kIq4nlValues[qs[l] & 15] + 128);
      u[l + 16] = static_cast<uint8_t>(kIq4nlValues[qs[l] >> 4] + 128);
    }
  }
};

// mxfp4: the E8M0 scale (halved, as the codebook is doubled) times kMxfp4Values[q] + 12.
struct FormatMXFP4 {
  using Block = BlockMXFP4;
  static constexpr int kBlocksPer = 1;
  static constexpr bool kSub16 = false;
  static constexpr int kBias = 12, kMaxU = 24;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    set_scales(s, e8m0_to_f32_half(static_cast<const Block*>(row)[b].e), 0.0f);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 16; ++l) {
      u[l] = static_cast<uint8_t>(kMxfp4Values[x.qs[l] & 15] + kBias);
      u[l + 16] = static_cast<uint8_t>(kMxfp4Values[x.qs[l] >> 4] + kBias);
    }
  }
};

// The ternary types: one scale d per super-block, u = t in {0, 1, 2}.
template <typename Derived, typename B>
struct TernaryScales : SuperScales<Derived, B> {
  static constexpr int kBias = 1;
  static constexpr bool kSub16 = false;
  static void one(const B& /*x*/, int /*j*/, float d, float /*dmin*/, BlockScales* s) {
    set_scales(s, d, 0.0f);
  }
};

// tq2_0: the 2-bit layout of q2_k (kMaxU 3: the unused code t = 3 reads as 2).
struct FormatTQ2_0 : TernaryScales<FormatTQ2_0, BlockTQ2_0> {
  static constexpr int kMaxU = 3;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = x.qs + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < 32; ++l) u[l] = (qs[l] >> shift) & 3;
  }
};

// tq1_0: 32-block j < 5 is trit j of qs[0..32); j = 5, 6: trits 2(j-5), 2(j-5)+1 of qs[32..48);
// j = 7: trit 4 of qs[32..48), then trit n of qh[l] at 16 + 4n + l.
struct FormatTQ1_0 : TernaryScales<FormatTQ1_0, BlockTQ1_0> {
  static constexpr int kMaxU = 2;
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    if (j < 5) {
      for (int l = 0; l < 32; ++l) u[l] = static_cast<uint8_t>(tq1_trit(x.qs[l], j));
      return;
    }
    const int t0 = 2 * (j - 5);
    for (int l = 0; l < 16; ++l) u[l] = static_cast<uint8_t>(tq1_trit(x.qs[32 + l], t0));
    if (j < 7) {
      for (int l = 0; l < 16; ++l) u[16 + l] = static_cast<uint8_t>(tq1_trit(x.qs[32 + l], t0 + 1));
    } else {
      for (int l = 0; l < 16; ++l) u[16 + l] = static_cast<uint8_t>(tq1_trit(x.qh[l % 4], l / 4));
    }
  }
};

// q2_k: 32-block j of a super-block holds sub-blocks 2j, 2j+1; its 2-bit quants are bits
// 2(j%4)..+1 of qs[32(j/4) + l].
struct FormatQ2_K : SuperScales<FormatQ2_K, BlockQ2_K> {
  static constexpr int kBias = 0, kMaxU = 3;
  static constexpr bool kSub16 = true;
  static void one(const Block& x, int j, float d, float dmin, BlockScales* s) {
    for (int h = 0; h < 2; ++h) {
      const uint8_t sc = x.scales[2 * j + h];
      s->scale[h] = d * static_cast<float>(sc & 15);
      s->min[h] = -(dmin * static_cast<float>(sc >> 4));
    }
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = x.qs + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < 32; ++l) u[l] = (qs[l] >> shift) & 3;
  }
};

// q3_k: low bits as q2_k, bit j of hmask[l] set means no -4 offset, so u = low | hbit << 2.
struct FormatQ3_K : SuperScales<FormatQ3_K, BlockQ3_K> {
  static constexpr int kBias = 4, kMaxU = 7;
  static constexpr bool kSub16 = true;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * j + h;
      const int low = i < 8 ? (x.scales[i] & 15) : (x.scales[i - 8] >> 4);
      const int high = (x.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
      s->scale[h] = d * static_cast<float>((low | high << 4) - 32);
      s->min[h] = 0.0f;
    }
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = x.qs + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < 32; ++l) u[l] = ((qs[l] >> shift) & 3) | ((x.hmask[l] >> j) & 1) << 2;
  }
};

// q4_k: 32-block j is nibble j%2 of qs[32(j/2) + l], scale and min from the packed 6-bit table.
struct FormatQ4_K : SuperScales<FormatQ4_K, BlockQ4_K> {
  static constexpr int kBias = 0, kMaxU = 15;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float dmin, BlockScales* s) {
    k4_scales(x.scales, j, d, dmin, s);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = x.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) u[l] = (qs[l] >> shift) & 15;
  }
};

// q5_k: q4_k plus bit j of qh[l] as the fifth bit.
struct FormatQ5_K : SuperScales<FormatQ5_K, BlockQ5_K> {
  static constexpr int kBias = 0, kMaxU = 31;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float dmin, BlockScales* s) {
    k4_scales(x.scales, j, d, dmin, s);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = x.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) u[l] = ((qs[l] >> shift) & 15) | ((x.qh[l] >> j) & 1) << 4;
  }
};

// q6_k: 32-block j = 4h + k covers elements 128h + 32k + l: low nibble k/2 of
// ql[64h + 32(k%2) + l], high bits 2k..2k+1 of qh[32h + l].
struct FormatQ6_K : SuperScales<FormatQ6_K, BlockQ6_K> {
  static constexpr int kBias = 32, kMaxU = 63;
  static constexpr bool kSub16 = true;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    for (int h = 0; h < 2; ++h) {
      s->scale[h] = d * static_cast<float>(x.scales[2 * j + h]);
      s->min[h] = 0.0f;
    }
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8), h = j / 4, k = j % 4;
    const uint8_t* ql = x.ql + 64 * h + 32 * (k % 2);
    const uint8_t* qh = x.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      u[l] = ((ql[l] >> (4 * (k / 2))) & 15) | ((qh[l] >> (2 * k)) & 3) << 4;
    }
  }
};

// ---- i-quants: u = signed grid value + kBias; scales as their dequantizers (quant/dequantize_iq.cpp)

inline uint32_t iq_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// u[8] = grid row values, negated where bit j of signs is set, plus bias.
inline void iq_signed_row8(uint64_t row, uint8_t signs, int bias, uint8_t* u) {
  for (int j = 0; j < 8; ++j) {
    const int v = grid_value(row, j);
    u[j] = static_cast<uint8_t>(((signs >> j) & 1 ? -v : v) + bias);
  }
}

inline float iq_half_step(float d, uint32_t s, float factor) {
  return d * (0.5f + static_cast<float>(s)) * factor;
}

struct FormatIQ2_XXS : SuperScales<FormatIQ2_XXS, BlockIQ2_XXS> {
  static constexpr int kBias = 43, kMaxU = 86;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    set_scales(s, iq_half_step(d, iq_u32(&x.qs[4 * j + 2]) >> 28, 0.25f), 0.0f);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint32_t grid = iq_u32(&x.qs[4 * j]), aux = iq_u32(&x.qs[4 * j + 2]);
    for (int l = 0; l < 4; ++l) {
      iq_signed_row8(kIq2xxsGrid[(grid >> (8 * l)) & 0xff], kIqSigns[(aux >> (7 * l)) & 127], kBias,
                     u + 8 * l);
    }
  }
};

// iq2_xs / iq2_s: a 4-bit scale per 16 elements.
inline void iq2_sub16_scales(const uint8_t* scales, int j, float d, BlockScales* s) {
  for (int h = 0; h < 2; ++h) {
    s->scale[h] = iq_half_step(d, (scales[j] >> (4 * h)) & 15, 0.25f);
    s->min[h] = 0.0f;
  }
}

struct FormatIQ2_XS : SuperScales<FormatIQ2_XS, BlockIQ2_XS> {
  static constexpr int kBias = 43, kMaxU = 86;
  static constexpr bool kSub16 = true;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    iq2_sub16_scales(x.scales, j, d, s);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = x.qs[4 * j + l];
      iq_signed_row8(kIq2xsGrid[q & 511], kIqSigns[q >> 9], kBias, u + 8 * l);
    }
  }
};

struct FormatIQ2_S : SuperScales<FormatIQ2_S, BlockIQ2_S> {
  static constexpr int kBias = 43, kMaxU = 86;
  static constexpr bool kSub16 = true;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    iq2_sub16_scales(x.scales, j, d, s);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    for (int l = 0; l < 4; ++l) {
      const int k = 4 * j + l;
      const int index = x.qs[k] | ((x.qh[j] >> (2 * l)) & 3) << 8;
      iq_signed_row8(kIq2sGrid[index], x.signs[k], kBias, u + 8 * l);
    }
  }
};

// u[4] of a 4-value grid row with sign bits shift..shift+3 of signs.
inline void iq_signed_row4(uint32_t row, uint8_t signs, int shift, int bias, uint8_t* u) {
  for (int j = 0; j < 4; ++j) {
    const int v = grid_value(row, j);
    u[j] = static_cast<uint8_t>(((signs >> (shift + j)) & 1 ? -v : v) + bias);
  }
}

struct FormatIQ3_XXS : SuperScales<FormatIQ3_XXS, BlockIQ3_XXS> {
  static constexpr int kBias = 62, kMaxU = 124;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    set_scales(s, iq_half_step(d, iq_u32(x.qs + kQK_K / 4 + 4 * j) >> 28, 0.5f), 0.0f);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint32_t aux = iq_u32(x.qs + kQK_K / 4 + 4 * j);
    for (int l = 0; l < 4; ++l) {
      const uint8_t signs = kIqSigns[(aux >> (7 * l)) & 127];
      iq_signed_row4(kIq3xxsGrid[x.qs[8 * j + 2 * l]], signs, 0, kBias, u + 8 * l);
      iq_signed_row4(kIq3xxsGrid[x.qs[8 * j + 2 * l + 1]], signs, 4, kBias, u + 8 * l + 4);
    }
  }
};

struct FormatIQ3_S : SuperScales<FormatIQ3_S, BlockIQ3_S> {
  static constexpr int kBias = 15, kMaxU = 30;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    set_scales(s, d * static_cast<float>(1 + 2 * ((x.scales[j / 2] >> (4 * (j % 2))) & 15)), 0.0f);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    for (int l = 0; l < 8; ++l) {
      const int k = 8 * j + l;
      const int index = x.qs[k] | ((x.qh[j] >> l) & 1) << 8;
      iq_signed_row4(kIq3sGrid[index], x.signs[k / 2], 4 * (k % 2), kBias, u + 4 * l);
    }
  }
};

// iq1: x = dl * (grid + delta) = (dl / 8) * (8 * grid + sign(delta)): u = 8 * grid ± 1 + 9, scale dl / 8.
inline void iq1_row_u(uint64_t row, bool negative_delta, uint8_t* u) {
  for (int j = 0; j < 8; ++j) u[j] = static_cast<uint8_t>(8 * grid_value(row, j) + (negative_delta ? 8 : 10));
}

struct FormatIQ1_S : SuperScales<FormatIQ1_S, BlockIQ1_S> {
  static constexpr int kBias = 9, kMaxU = 18;
  static constexpr bool kSub16 = false;
  static void one(const Block& x, int j, float d, float /*dmin*/, BlockScales* s) {
    set_scales(s, d * static_cast<float>(2 * ((x.qh[j] >> 12) & 7) + 1) * kIq1Delta, 0.0f);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    const uint32_t h = x.qh[j];
    for (int l = 0; l < 4; ++l) {
      iq1_row_u(kIq1sGrid[x.qs[4 * j + l] | ((h >> (3 * l)) & 7) << 8], (h & 0x8000) != 0, u + 8 * l);
    }
  }
};

// iq1_m: no d field of its own (its bits are spread over the scale words), so not SuperScales.
struct FormatIQ1_M {
  using Block = BlockIQ1_M;
  static constexpr int kBlocksPer = 8;
  static constexpr int kBias = 9, kMaxU = 18;
  static constexpr bool kSub16 = true;
  static void words(const Block& x, uint16_t sc[4]) { std::memcpy(sc, x.scales, 8); }
  static float d_of(const uint16_t sc[4]) {
    const uint16_t bits = static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 8 & 0x00f0) |
                                                (sc[2] >> 4 & 0x0f00) | (sc[3] & 0xf000));
    return half_to_float(bits);
  }
  static void one(const uint16_t sc[4], int j, float d, BlockScales* s) {
    for (int h = 0; h < 2; ++h) {
      const int g = 2 * j + h;
      s->scale[h] = d * static_cast<float>(2 * ((sc[g / 4] >> (3 * (g % 4))) & 7) + 1) * kIq1Delta;
      s->min[h] = 0.0f;
    }
  }
  static void scales(const void* row, int64_t b, BlockScales* s) {
    uint16_t sc[4];
    words(static_cast<const Block*>(row)[b / 8], sc);
    one(sc, static_cast<int>(b % 8), d_of(sc), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    uint16_t sc[4];
    words(static_cast<const Block*>(row)[i], sc);
    const float d = d_of(sc);
    for (int j = 0; j < 8; ++j) one(sc, j, d, &s[j]);
  }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    const int j = static_cast<int>(b % 8);
    for (int l = 0; l < 4; ++l) {
      const int k = 4 * j + l;
      const int nib = (x.qh[k / 2] >> (4 * (k % 2))) & 15;
      iq1_row_u(kIq1sGrid[x.qs[k] | (nib & 7) << 8], (nib & 8) != 0, u + 8 * l);
    }
  }
};

// fn(type, Format{}) for every quantized weight type the matmul kernels read, in DType order:
// each ISA's kernel table fills its entries from it.
template <typename Fn>
constexpr void for_each_block_format(Fn&& fn) {
  fn(DType::q4_0, FormatQ4_0{});
  fn(DType::q4_1, FormatQ4_1{});
  fn(DType::q5_0, FormatQ5_0{});
  fn(DType::q5_1, FormatQ5_1{});
  fn(DType::q8_0, FormatQ8_0{});
  fn(DType::iq4_nl, FormatIQ4_NL{});
  fn(DType::iq4_xs, FormatIQ4_XS{});
  fn(DType::q2_k, FormatQ2_K{});
  fn(DType::q3_k, FormatQ3_K{});
  fn(DType::q4_k, FormatQ4_K{});
  fn(DType::q5_k, FormatQ5_K{});
  fn(DType::q6_k, FormatQ6_K{});
  fn(DType::tq1_0, FormatTQ1_0{});
  fn(DType::tq2_0, FormatTQ2_0{});
  fn(DType::mxfp4, FormatMXFP4{});
  fn(DType::iq2_xxs, FormatIQ2_XXS{});
  fn(DType::iq2_xs, FormatIQ2_XS{});
  fn(DType::iq2_s, FormatIQ2_S{});
  fn(DType::iq3_xxs, FormatIQ3_XXS{});
  fn(DType::iq3_s, FormatIQ3_S{});
  fn(DType::iq1_s, FormatIQ1_S{});
  fn(DType::iq1_m, FormatIQ1_M{});
}

}  // namespace
}  // namespace ember::cpu
