// cpu/x86/gemm_pack_avx512.h: packing one K chunk of a 16-column weight panel (PanelBlock<16>, see
// gemm_pack_x86.h) with AVX-512 permutes. Shared by the avx512 and amx GEMMs, which read the same
// panel: its u area per block is a vpdpbusd operand row by row and, as a whole, an AMX B tile
// (8 rows of 16 columns x 4 quants).
// Included only by *_avx512.cpp / *_amx.cpp; internal linkage (see block_formats.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "cpu/x86/gemm_pack_x86.h"

namespace ember::cpu {
namespace {

using Panel16 = PanelBlock<16>;
static_assert(sizeof(Panel16) == 768);

// Index vectors of the 16 x 8 dword transpose in pack_panel16 (see there): rows 0-1 stage 1
// (g 0..3 / 4..7), rows 2-3 stage 2 (g pairs), rows 4-5 stage 3 (the two groups of a pair).
struct TransposeTable {
  alignas(64) int32_t v[6][16];
};

constexpr TransposeTable make_transpose_table() {
  TransposeTable t{};
  for (int e = 0; e < 16; ++e) {
    const int c4 = e % 4, g4 = e / 4;  // stage 1 output [g (4)][c (4)] from two [c (2)][g (8)]
    const int src1[4] = {g4, 8 + g4, 16 + g4, 24 + g4};
    t.v[0][e] = src1[c4];
    t.v[1][e] = src1[c4] + 4;
    const int c8 = e % 8, g2 = e / 8;  // stage 2 output [g (2)][c (8)] from two [g (4)][c (4)]
    for (int half = 0; half < 2; ++half) {
      const int g = g2 + 2 * half;
      t.v[2 + half][e] = c8 < 4 ? g * 4 + c8 : 16 + g * 4 + (c8 - 4);
    }
    for (int k = 0; k < 2; ++k) {  // stage 3 output [c (16)] from two [g (2)][c (8)]
      t.v[4 + k][e] = e < 8 ? k * 8 + e : 16 + k * 8 + (e - 8);
    }
  }
  return t;
}

constexpr TransposeTable kTranspose = make_transpose_table();

inline __m512i transpose_index(int i) { return _mm512_load_si512(kTranspose.v[i]); }

// The scale fields of block b of 16 columns as a Panel holds them (see pack_quant_panel in
// gemm_pack_x86.h): scale[h] per 16-element half, and with corr_h = min_h - kBias * scale_h,
// coef_s = corr1 (kSub16) or corr0, coef_s_lo = corr0 - corr1 (kSub16) or 0. Computed for all 16
// columns at once from a few gathers per (super-)block, with each value one IEEE operation on
// the block's fields (kBias is 0 or a power of two, so min - kBias * scale rounds once however
// it is compiled). The GEMMs' panels and the small-row kernel both take their scales from here.
struct ColumnScales {
  __m512 scale0, scale1, coef_s, coef_s_lo;
};

template <typename F>
concept HasMin = requires(const typename F::Block& x) {
  x.m;
};

// Super-block formats whose scales ColumnScaleReader decodes in vectors; the others (the
// i-quants) are decoded column by column with their scalar scales_all().
template <typename F>
constexpr bool kVectorScales = std::is_same_v<F, FormatQ2_K> || std::is_same_v<F, FormatQ3_K> ||
                               std::is_same_v<F, FormatQ4_K> || std::is_same_v<F, FormatQ5_K> ||
                               std::is_same_v<F, FormatQ6_K> || std::is_same_v<F, FormatTQ1_0> ||
                               std::is_same_v<F, FormatTQ2_0>;

// Formats whose scales ColumnScaleReader decodes: all the quantized weight formats.
template <typename F>
constexpr bool kColumnScales = true;

// (Masked intrinsics throughout: GCC 12 warns about the plain ones' undefined pass-through.)
inline __m512i gather32(const uint8_t* base, __m512i offsets) {
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, offsets, base, 1);
}
inline __m512 half_lo(__m512i v) {  // the f16 in bits 0..15 of each lane
  return _mm512_maskz_cvtph_ps(0xffff, _mm512_maskz_cvtepi32_epi16(0xffff, v));
}
inline __m512 half_hi(__m512i v) {  // the f16 in bits 16..31
  return half_lo(_mm512_maskz_srli_epi32(0xffff, v, 16));
}
inline __m512i byte_of(const __m512i* words, int k) {  // byte k of the bytes the words hold
  return _mm512_maskz_and_epi32(0xffff, _mm512_maskz_srli_epi32(0xffff, words[k / 4], 8 * (k % 4)),
                                _mm512_set1_epi32(0xff));
}
inline __m512 to_float_lanes(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xffff, v); }
// e8m0_to_f32_half of the byte in bits 0..7 of each lane.
inline __m512 e8m0_half(__m512i v) {
  const __m512i e = _mm512_maskz_and_epi32(0xffff, v, _mm512_set1_epi32(0xff));
  const __m512i normal = _mm512_maskz_slli_epi32(0xffff,
                                                 _mm512_maskz_sub_epi32(0xffff, e, _mm512_set1_epi32(1)), 23);
  const __m512i subnormal = _mm512_maskz_sllv_epi32(0xffff, _mm512_set1_epi32(0x00200000), e);
  const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal));
}

// The per-16 scales of both halves of a block, with min_h as given, and the corrections as
// pack_panel16's per-column code computes them.
template <typename F>
inline ColumnScales sub16_scales(const __m512 scale[2], const __m512 min[2]) {
  const __m512 bias = _mm512_set1_ps(float(F::kBias));
  const __m512 corr0 = _mm512_sub_ps(min[0], _mm512_mul_ps(bias, scale[0]));
  const __m512 corr1 = _mm512_sub_ps(min[1], _mm512_mul_ps(bias, scale[1]));
  return {scale[0], scale[1], corr1, _mm512_sub_ps(corr0, corr1)};
}

// q6_k: the scales of the 8 blocks of 16 columns' super-blocks from d (f32) and the int8
// scales[16] as 4 dwords per column (sc[q]: scales[4q .. 4q + 3]).
inline void decode_q6_k_scales(__m512 d, const __m512i sc[4], ColumnScales k[8]) {
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < 8; ++j) {
    __m512 scale[2];
    for (int h = 0; h < 2; ++h) {  // int8 scales[2j + h], sign-extended
      const __m512i u8 = byte_of(sc, 2 * j + h);
      const __m512i s8 = _mm512_maskz_srai_epi32(0xffff, _mm512_maskz_slli_epi32(0xffff, u8, 24), 24);
      scale[h] = _mm512_mul_ps(d, to_float_lanes(s8));
    }
    const __m512 min[2] = {zero, zero};
    k[j] = sub16_scales<FormatQ6_K>(scale, min);
  }
}

// q4_k / q5_k: the scales of the 8 blocks from the dwords d | dmin << 16 and the 12-byte
// 6-bit scale / min table (t[q]: bytes 4q .. 4q + 3).
template <typename F>
inline void decode_k4_scales(__m512i ddmin, const __m512i t[3], ColumnScales k[8]) {
  const __m512 d = half_lo(ddmin), dmin = half_hi(ddmin);
  const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m48 = _mm512_set1_epi32(0x30);
  for (int j = 0; j < 8; ++j) {
    __m512i sc, m;
    if (j < 4) {
      sc = _mm512_maskz_and_epi32(0xffff, byte_of(t, j), m63);
      m = _mm512_maskz_and_epi32(0xffff, byte_of(t, j + 4), m63);
    } else {
      const __m512i hi4 = byte_of(t, j + 4);
      sc = _mm512_maskz_or_epi32(
          0xffff, _mm512_maskz_and_epi32(0xffff, hi4, m15),
          _mm512_maskz_and_epi32(0xffff, _mm512_maskz_srli_epi32(0xffff, byte_of(t, j - 4), 2), m48));
      m = _mm512_maskz_or_epi32(
          0xffff, _mm512_maskz_srli_epi32(0xffff, hi4, 4),
          _mm512_maskz_and_epi32(0xffff, _mm512_maskz_srli_epi32(0xffff, byte_of(t, j), 2), m48));
    }
    const __m512 scale = _mm512_mul_ps(d, to_float_lanes(sc));
    // -(dmin * m): a sign flip, as the scalar negation.
    const __m512 min = _mm512_xor_ps(_mm512_mul_ps(dmin, to_float_lanes(m)), _mm512_set1_ps(-0.0f));
    const __m512 corr0 = _mm512_sub_ps(min, _mm512_mul_ps(_mm512_set1_ps(float(F::kBias)), scale));
    k[j] = {scale, scale, corr0, _mm512_setzero_ps()};
  }
}

template <typename F>
struct ColumnScaleReader {
  static_assert(kColumnScales<F>);
  const uint8_t* w;               // column 0's weight row
  __m512i offsets;                // bytes from column 0's row to each column's row
  ColumnScales k[F::kBlocksPer];  // K-quants: the scales of the current super-block's blocks

  // The scales of block b; K-quants decode a super-block when b enters it (b in order).
  const ColumnScales& at(int64_t b) {
    constexpr int64_t kBytes = sizeof(typename F::Block);
    const uint8_t* block = w + b / F::kBlocksPer * kBytes;
    if constexpr (F::kBlocksPer == 1) {
      const __m512i dm = gather32(block, offsets);  // d, and m for q4_1 / q5_1; mxfp4's e
      k[0].scale0 = k[0].scale1 = std::is_same_v<F, FormatMXFP4> ? e8m0_half(dm) : half_lo(dm);
      const __m512 min = HasMin<F> ? half_hi(dm) : _mm512_setzero_ps();
      k[0].coef_s = _mm512_sub_ps(min, _mm512_mul_ps(_mm512_set1_ps(float(F::kBias)), k[0].scale0));
      k[0].coef_s_lo = _mm512_setzero_ps();
      return k[0];
    } else {
      const int j = static_cast<int>(b % F::kBlocksPer);
      if (j == 0) decode(block);
      return k[j];
    }
  }

  void set_sub16(int j, const __m512 scale[2], const __m512 min[2]) { k[j] = sub16_scales<F>(scale, min); }

  void decode(const uint8_t* block) {
    const __m512 zero = _mm512_setzero_ps();
    if constexpr (std::is_same_v<F, FormatQ2_K>) {  // scales[16]: low nibble scale, high min
      const __m512i ddmin = gather32(block + offsetof(BlockQ2_K, d), offsets);
      const __m512 d = half_lo(ddmin), dmin = half_hi(ddmin);
      __m512i sc[4];
      for (int q = 0; q < 4; ++q) sc[q] = gather32(block + offsetof(BlockQ2_K, scales) + 4 * q, offsets);
      for (int j = 0; j < 8; ++j) {
        __m512 scale[2], min[2];
        for (int h = 0; h < 2; ++h) {
          const __m512i b = byte_of(sc, 2 * j + h);
          scale[h] = _mm512_mul_ps(d,
                                   to_float_lanes(_mm512_maskz_and_epi32(0xffff, b, _mm512_set1_epi32(15))));
          min[h] = _mm512_xor_ps(_mm512_mul_ps(dmin, to_float_lanes(_mm512_maskz_srli_epi32(0xffff, b, 4))),
                                 _mm512_set1_ps(-0.0f));  // -(dmin * m)
        }
        set_sub16(j, scale, min);
      }
    } else if constexpr (std::is_same_v<F, FormatQ3_K>) {  // 16 packed 6-bit scales, minus 32
      // d is the last 2 bytes: the gather 2 bytes before it reads scales[10..11] and d.
      const __m512 d = half_hi(gather32(block + offsetof(BlockQ3_K, d) - 2, offsets));
      __m512i sc[3];
      for (int q = 0; q < 3; ++q) sc[q] = gather32(block + offsetof(BlockQ3_K, scales) + 4 * q, offsets);
      const __m512i m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
      for (int j = 0; j < 8; ++j) {
        __m512 scale[2];
        const __m512 min[2] = {zero, zero};
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * j + h;
          const __m512i low = i < 8 ? _mm512_maskz_and_epi32(0xffff, byte_of(sc, i), m15)
                                    : _mm512_maskz_srli_epi32(0xffff, byte_of(sc, i - 8), 4);
          const __m512i high = _mm512_maskz_and_epi32(
              0xffff, _mm512_maskz_srli_epi32(0xffff, byte_of(sc, 8 + i % 4), 2 * (i / 4)), m3);
          const __m512i value = _mm512_maskz_sub_epi32(
              0xffff, _mm512_maskz_or_epi32(0xffff, low, _mm512_maskz_slli_epi32(0xffff, high, 4)),
              _mm512_set1_epi32(32));
          scale[h] = _mm512_mul_ps(d, to_float_lanes(value));
        }
        set_sub16(j, scale, min);
      }
    } else if constexpr (std::is_same_v<F, FormatQ6_K>) {
      // d is the last 2 bytes: the gather at 206 reads scales[14..15] and d.
      const __m512 d = half_hi(gather32(block + offsetof(BlockQ6_K, d) - 2, offsets));
      __m512i sc[4];
      for (int q = 0; q < 4; ++q) sc[q] = gather32(block + offsetof(BlockQ6_K, scales) + 4 * q, offsets);
      decode_q6_k_scales(d, sc, k);
    } else if constexpr (std::is_same_v<F, FormatTQ1_0> || std::is_same_v<F, FormatTQ2_0>) {
      // d is the last 2 bytes; every block has the scale d.
      const __m512 d = half_hi(gather32(block + offsetof(typename F::Block, d) - 2, offsets));
      const __m512 scale[2] = {d, d}, min[2] = {zero, zero};
      for (int j = 0; j < 8; ++j) set_sub16(j, scale, min);
    } else if constexpr (!kVectorScales<F>) {
      alignas(64) int32_t offset[16];
      _mm512_store_si512(offset, offsets);
      alignas(64) float scale[2][F::kBlocksPer][16], min[2][F::kBlocksPer][16];
      for (int c = 0; c < 16; ++c) {
        BlockScales s[F::kBlocksPer];
        F::scales_all(block + offset[c], 0, s);
        for (int j = 0; j < F::kBlocksPer; ++j) {
          for (int h = 0; h < 2; ++h) {
            scale[h][j][c] = s[j].scale[h];
            min[h][j][c] = s[j].min[h];
          }
        }
      }
      for (int j = 0; j < F::kBlocksPer; ++j) {
        const __m512 sc[2] = {_mm512_load_ps(scale[0][j]), _mm512_load_ps(scale[1][j])};
        const __m512 mn[2] = {_mm512_load_ps(min[0][j]), _mm512_load_ps(min[1][j])};
        set_sub16(j, sc, mn);
      }
    } else {  // q4_k, q5_k: d, dmin, then the 6-bit scale / min table
      const __m512i ddmin = gather32(block, offsets);
      __m512i t[3];
      for (int q = 0; q < 3; ++q) t[q] = gather32(block + 4 + 4 * q, offsets);
      decode_k4_scales<F>(ddmin, t, k);
    }
  }
};

// pack_quant_panel for 16 columns and one K chunk. Pass 1 reads each weight row's chunk in
// order and stores each block's 32 quants column-major into the block's u area (storing 4-byte
// groups straight into the interleaved layout took 8 scattered stores per block); pass 2
// transposes every u area in place, as a 16 x 8 matrix of 4-byte groups, in three rounds of two-source
// permutes (4 -> 8 -> 16 columns per vector). panel[n_blocks] = blocks [b0, b0 + n_blocks) of columns [c0, c0
// + nc); b0 is a multiple of F::kBlocksPer.
template <typename F>
void pack_panel16(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int nc, int64_t b0, int64_t n_blocks,
                  Panel16* panel) {
  if (nc < 16) std::memset(static_cast<void*>(panel), 0, sizeof(Panel16) * n_blocks);
  static_assert(kColumnScales<F>);
  // The quants column by column, then the scales of all 16 columns per block.
  alignas(64) int32_t offsets[16];
  for (int c = 0; c < 16; ++c) offsets[c] = static_cast<int32_t>(std::min(c, nc - 1) * w_row_bytes);
  for (int c = 0; c < nc; ++c) {
    const uint8_t* row = w + (c0 + c) * w_row_bytes;
    for (int64_t i = 0; i < n_blocks; ++i) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(&panel[i].u[0][0][0] + 32 * c),
                         quants_x86(F{}, row, b0 + i));
    }
  }
  ColumnScaleReader<F> scales{w + c0 * w_row_bytes, _mm512_load_si512(offsets), {}};
  for (int64_t i = 0; i < n_blocks; ++i) {
    const ColumnScales& s = scales.at(b0 + i);
    _mm512_store_ps(panel[i].scale[0], s.scale0);
    _mm512_store_ps(panel[i].scale[1], s.scale1);
    _mm512_store_ps(panel[i].coef_s, s.coef_s);
    _mm512_store_ps(panel[i].coef_s_lo, s.coef_s_lo);
  }
  const __m512i s1_index[2] = {transpose_index(0), transpose_index(1)};
  const __m512i s2_index[2] = {transpose_index(2), transpose_index(3)};
  const __m512i s3_index[2] = {transpose_index(4), transpose_index(5)};
  for (int64_t i = 0; i < n_blocks; ++i) {
    Panel16& p = panel[i];
    const uint8_t* t = &p.u[0][0][0];  // [16 columns][32 quants]
    __m512i z[8], s1[8], s2[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) z[k] = _mm512_load_si512(t + 64 * k);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {  // columns 4q..4q+3: [g 0..3][c], [g 4..7][c]
      s1[2 * q] = _mm512_permutex2var_epi32(z[2 * q], s1_index[0], z[2 * q + 1]);
      s1[2 * q + 1] = _mm512_permutex2var_epi32(z[2 * q], s1_index[1], z[2 * q + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // columns 8h..8h+7: [g 0,1], [g 2,3], [g 4,5], [g 6,7]
      const __m512i* a = &s1[4 * h];
      s2[4 * h + 0] = _mm512_permutex2var_epi32(a[0], s2_index[0], a[2]);
      s2[4 * h + 1] = _mm512_permutex2var_epi32(a[0], s2_index[1], a[2]);
      s2[4 * h + 2] = _mm512_permutex2var_epi32(a[1], s2_index[0], a[3]);
      s2[4 * h + 3] = _mm512_permutex2var_epi32(a[1], s2_index[1], a[3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {  // all 16 columns of groups 2m, 2m+1
      _mm512_store_si512(p.u[2 * m], _mm512_permutex2var_epi32(s2[m], s3_index[0], s2[4 + m]));
      _mm512_store_si512(p.u[2 * m + 1], _mm512_permutex2var_epi32(s2[m], s3_index[1], s2[4 + m]));
    }
  }
}

}  // namespace
}  // namespace ember::cpu
