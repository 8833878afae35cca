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

#include "quant/blocks.h"
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

struct FormatQ4_0 {
  using Block = BlockQ4_0;
  static constexpr int kBlocksPer = 1, kBias = 8, kMaxU = 15;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    set_scales(s, half_to_float(static_cast<const Block*>(row)[b].d), 0.0f);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 16; ++l) {
      u[l] = x.qs[l] & 15;
      u[l + 16] = x.qs[l] >> 4;
    }
  }
};

struct FormatQ4_1 {
  using Block = BlockQ4_1;
  static constexpr int kBlocksPer = 1, kBias = 0, kMaxU = 15;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b];
    set_scales(s, half_to_float(x.d), half_to_float(x.m));
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 16; ++l) {
      u[l] = x.qs[l] & 15;
      u[l + 16] = x.qs[l] >> 4;
    }
  }
};

inline uint32_t load_u32(const uint8_t* p) {
  return p[0] | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

struct FormatQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kBlocksPer = 1, kBias = 16, kMaxU = 31;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    set_scales(s, half_to_float(static_cast<const Block*>(row)[b].d), 0.0f);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    const uint32_t qh = load_u32(x.qh);
    for (int l = 0; l < 16; ++l) {
      u[l] = (x.qs[l] & 15) | ((qh >> l) & 1) << 4;
      u[l + 16] = (x.qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4;
    }
  }
};

struct FormatQ5_1 {
  using Block = BlockQ5_1;
  static constexpr int kBlocksPer = 1, kBias = 0, kMaxU = 31;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b];
    set_scales(s, half_to_float(x.d), half_to_float(x.m));
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    const uint32_t qh = load_u32(x.qh);
    for (int l = 0; l < 16; ++l) {
      u[l] = (x.qs[l] & 15) | ((qh >> l) & 1) << 4;
      u[l + 16] = (x.qs[l] >> 4) | ((qh >> (l + 16)) & 1) << 4;
    }
  }
};

struct FormatQ8_0 {
  using Block = BlockQ8_0;
  static constexpr int kBlocksPer = 1, kBias = 128, kMaxU = 255;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    set_scales(s, half_to_float(static_cast<const Block*>(row)[b].d), 0.0f);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 32; ++l) u[l] = static_cast<uint8_t>(x.qs[l] + 128);
  }
};

struct FormatIQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr int kBlocksPer = 1, kBias = 128, kMaxU = 255;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    set_scales(s, half_to_float(static_cast<const Block*>(row)[b].d), 0.0f);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) { scales(row, i, s); }
  static void quants(const void* row, int64_t b, uint8_t u[32]) {
    const Block& x = static_cast<const Block*>(row)[b];
    for (int l = 0; l < 16; ++l) {
      u[l] = static_cast<uint8_t>(kIq4nlValues[x.qs[l] & 15] + 128);
      u[l + 16] = static_cast<uint8_t>(kIq4nlValues[x.qs[l] >> 4] + 128);
    }
  }
};

// q2_k: 32-block j of a super-block holds sub-blocks 2j, 2j+1; its 2-bit quants are bits
// 2(j%4)..+1 of qs[32(j/4) + l].
struct FormatQ2_K {
  using Block = BlockQ2_K;
  static constexpr int kBlocksPer = 8, kBias = 0, kMaxU = 3;
  static constexpr bool kSub16 = true;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    one(x, static_cast<int>(b % 8), half_to_float(x.d), half_to_float(x.dmin), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d), dmin = half_to_float(x.dmin);
    for (int j = 0; j < 8; ++j) one(x, j, d, dmin, &s[j]);
  }
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
struct FormatQ3_K {
  using Block = BlockQ3_K;
  static constexpr int kBlocksPer = 8, kBias = 4, kMaxU = 7;
  static constexpr bool kSub16 = true;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    one(x, static_cast<int>(b % 8), half_to_float(x.d), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d);
    for (int j = 0; j < 8; ++j) one(x, j, d, &s[j]);
  }
  static void one(const Block& x, int j, float d, BlockScales* s) {
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
struct FormatQ4_K {
  using Block = BlockQ4_K;
  static constexpr int kBlocksPer = 8, kBias = 0, kMaxU = 15;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    k4_scales(x.scales, static_cast<int>(b % 8), half_to_float(x.d), half_to_float(x.dmin), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d), dmin = half_to_float(x.dmin);
    for (int j = 0; j < 8; ++j) k4_scales(x.scales, j, d, dmin, &s[j]);
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
struct FormatQ5_K {
  using Block = BlockQ5_K;
  static constexpr int kBlocksPer = 8, kBias = 0, kMaxU = 31;
  static constexpr bool kSub16 = false;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    k4_scales(x.scales, static_cast<int>(b % 8), half_to_float(x.d), half_to_float(x.dmin), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d), dmin = half_to_float(x.dmin);
    for (int j = 0; j < 8; ++j) k4_scales(x.scales, j, d, dmin, &s[j]);
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
struct FormatQ6_K {
  using Block = BlockQ6_K;
  static constexpr int kBlocksPer = 8, kBias = 32, kMaxU = 63;
  static constexpr bool kSub16 = true;
  static void scales(const void* row, int64_t b, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[b / 8];
    one(x, static_cast<int>(b % 8), half_to_float(x.d), s);
  }
  static void scales_all(const void* row, int64_t i, BlockScales* s) {
    const Block& x = static_cast<const Block*>(row)[i];
    const float d = half_to_float(x.d);
    for (int j = 0; j < 8; ++j) one(x, j, d, &s[j]);
  }
  static void one(const Block& x, int j, float d, BlockScales* s) {
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

}  // namespace
}  // namespace ember::cpu
