// cpu/gemm_pack_avx512.h: packing one K chunk of a 16-column weight panel (PanelBlock<16>, see
// gemm_pack_x86.h) with AVX-512 permutes. Shared by the avx512 and amx GEMMs, which read the same
// panel: its u area per block is a vpdpbusd operand row by row and, as a whole, an AMX B tile
// (8 rows of 16 columns x 4 quants).
// Included only by *_avx512.cpp / *_amx.cpp; internal linkage (see block_formats.h).
#pragma once

#include <algorithm>

#include "cpu/gemm_pack_x86.h"

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

// The scales of block b of 16 columns, as pack_panel16 stores them in a Panel (scale[0] and
// coef_s; one-block formats have no per-16 scales).
struct ColumnScales {
  __m512 scale, coef_s;
};

template <typename F>
concept HasMin = requires(const typename F::Block& x) { x.m; };

// The scales of block b of 16 columns of a one-block format: d (and m for q4_1 / q5_1) start
// every block, so one gather fetches both f16 values of all 16 columns.
template <typename F>
ColumnScales column_scales(const uint8_t* w, __m512i offsets, int64_t b) {
  // (Masked forms throughout: GCC 12 warns about the plain ones' undefined pass-through.)
  const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, offsets,
                                                 w + b * int64_t(sizeof(typename F::Block)), 1);
  ColumnScales s;
  s.scale = _mm512_maskz_cvtph_ps(0xffff, _mm512_maskz_cvtepi32_epi16(0xffff, dm));
  __m512 min = _mm512_setzero_ps();
  if constexpr (HasMin<F>) {
    min = _mm512_maskz_cvtph_ps(0xffff, _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_maskz_srli_epi32(0xffff, dm, 16)));
  }
  s.coef_s = _mm512_sub_ps(min, _mm512_mul_ps(_mm512_set1_ps(float(F::kBias)), s.scale));
  return s;
}

// pack_quant_panel for 16 columns and one K chunk. Pass 1 reads each weight row's chunk in
// order and stores each block's 32 quants column-major into the block's u area (storing 4-byte
// groups straight into the interleaved layout took 8 scattered stores per block); pass 2
// transposes every u area in place, as a 16 x 8 matrix of 4-byte groups, in three rounds of two-source permutes
// (4 -> 8 -> 16 columns per vector).
// panel[n_blocks] = blocks [b0, b0 + n_blocks) of columns [c0, c0 + nc); b0 is a multiple of
// F::kBlocksPer.
template <typename F>
void pack_panel16(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int nc, int64_t b0,
                  int64_t n_blocks, Panel16* panel) {
  if (nc < 16) std::memset(static_cast<void*>(panel), 0, sizeof(Panel16) * n_blocks);
  if constexpr (F::kBlocksPer == 1) {
    // One-block formats: the quants column by column, the scales of all columns per block in
    // one gather (the same floats the per-column code below would store).
    alignas(64) int32_t offsets[16];
    for (int c = 0; c < 16; ++c) offsets[c] = static_cast<int32_t>(std::min(c, nc - 1) * w_row_bytes);
    const uint8_t* w0 = w + c0 * w_row_bytes;
    for (int c = 0; c < nc; ++c) {
      const uint8_t* row = w + (c0 + c) * w_row_bytes;
      for (int64_t i = 0; i < n_blocks; ++i) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(&panel[i].u[0][0][0] + 32 * c), quants_x86(F{}, row, b0 + i));
      }
    }
    const __m512i column_offsets = _mm512_load_si512(offsets);
    for (int64_t i = 0; i < n_blocks; ++i) {
      const ColumnScales s = column_scales<F>(w0, column_offsets, b0 + i);
      _mm512_store_ps(panel[i].scale[0], s.scale);
      _mm512_store_ps(panel[i].scale[1], s.scale);
      _mm512_store_ps(panel[i].coef_s, s.coef_s);
      _mm512_store_ps(panel[i].coef_s_lo, _mm512_setzero_ps());
    }
  }
  for (int c = 0; c < (F::kBlocksPer == 1 ? 0 : nc); ++c) {
    const uint8_t* row = w + (c0 + c) * w_row_bytes;
    BlockScales scales[F::kBlocksPer];
    for (int64_t i = 0; i < n_blocks; ++i) {
      Panel16& p = panel[i];
      const int64_t b = b0 + i;
      if (b % F::kBlocksPer == 0) F::scales_all(row, b / F::kBlocksPer, scales);
      const BlockScales& s = scales[b % F::kBlocksPer];
      _mm256_store_si256(reinterpret_cast<__m256i*>(&p.u[0][0][0] + 32 * c), quants_x86(F{}, row, b));
      const float corr0 = s.min[0] - F::kBias * s.scale[0], corr1 = s.min[1] - F::kBias * s.scale[1];
      p.scale[0][c] = s.scale[0];
      p.scale[1][c] = s.scale[1];
      // As pack_quant_panel: corr0 * s_lo + corr1 * (s - s_lo) = corr1 * s + (corr0 - corr1) * s_lo.
      p.coef_s[c] = F::kSub16 ? corr1 : corr0;
      p.coef_s_lo[c] = F::kSub16 ? corr0 - corr1 : 0.0f;
    }
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
