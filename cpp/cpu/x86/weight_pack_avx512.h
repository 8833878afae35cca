// cpu/x86/weight_pack_avx512.h: the avx512 / amx kernels' readers of the packed weight layout
// (weight_pack.h), and the panel chunk packer that takes either layout. Included only by
// *_avx512.cpp / *_amx.cpp; internal linkage (see block_formats.h).
#pragma once

#include "cpu/weight_pack.h"
#include "cpu/x86/gemm_pack_avx512.h"

namespace ember::cpu {
namespace {

// Readers of one packed block (F::kBlocksPer 32-element blocks) of 16 columns: quant(p, j, g)
// gives the u vector of 32-element block j's four-element group g (lane c = column c's elements
// 4g .. 4g + 3, a Panel16 u row as is), one group at a time so that a kernel holds only the
// groups it is using; scales(p, s) the ColumnScales of every block j, computed with the same
// operations as ColumnScaleReader on the file's fields, so packed and unpacked weights give the
// same bits. kPacked is false for types without a packed layout.
template <typename F>
struct Packed16Reader {
  static constexpr bool kPacked = false;
};

// Scales of the one-scale-per-block formats, as ColumnScaleReader computes them.
inline void packed_scales(const uint16_t* d, const uint16_t* m, int bias, ColumnScales* s) {
  s->scale0 = s->scale1 = _mm512_maskz_cvtph_ps(0xffff,
                                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d)));
  const __m512 min = m ? _mm512_maskz_cvtph_ps(0xffff,
                                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m)))
                       : _mm512_setzero_ps();
  s->coef_s = _mm512_sub_ps(min, _mm512_mul_ps(_mm512_set1_ps(float(bias)), s->scale0));
  s->coef_s_lo = _mm512_setzero_ps();
}

// u[g] of the 4-bit layouts that keep groups g and g + 4 in the low and high nibbles of v[g % 4].
inline __m512i nibble_group(const uint8_t (*v)[kPackCols][4], int g) {
  const __m512i x = _mm512_loadu_si512(v[g % 4]);
  return _mm512_and_si512(g < 4 ? x : _mm512_srli_epi16(x, 4), _mm512_set1_epi8(15));
}

inline __m512i load_u32x16(const uint32_t* p) { return _mm512_loadu_si512(p); }

template <>
struct Packed16Reader<FormatQ4_0> {
  static constexpr bool kPacked = true;
  using Block = PackedQ4_0;
  static __m512i quant(const Block& p, int, int g) { return nibble_group(p.qs, g); }
  static void scales(const Block& p, ColumnScales* s) { packed_scales(p.d, nullptr, FormatQ4_0::kBias, s); }
};

template <>
struct Packed16Reader<FormatQ4_1> {
  static constexpr bool kPacked = true;
  using Block = PackedQ4_1;
  static __m512i quant(const Block& p, int, int g) { return nibble_group(p.qs, g); }
  static void scales(const Block& p, ColumnScales* s) { packed_scales(p.d, p.m, FormatQ4_1::kBias, s); }
};

template <>
struct Packed16Reader<FormatQ8_0> {
  static constexpr bool kPacked = true;
  using Block = PackedQ8_0;
  static __m512i quant(const Block& p, int, int g) { return _mm512_loadu_si512(p.u[g]); }
  static void scales(const Block& p, ColumnScales* s) { packed_scales(p.d, nullptr, FormatQ8_0::kBias, s); }
};

template <>
struct Packed16Reader<FormatQ4_K> {
  static constexpr bool kPacked = true;
  using Block = PackedQ4_K;
  static __m512i quant(const Block& p, int j, int g) {
    const __m512i x = _mm512_loadu_si512(p.qs[j / 2][g]);
    return _mm512_and_si512(j % 2 ? _mm512_srli_epi16(x, 4) : x, _mm512_set1_epi8(15));
  }
  static void scales(const Block& p, ColumnScales* s) {
    const __m512i t[3] = {load_u32x16(p.sc[0]), load_u32x16(p.sc[1]), load_u32x16(p.sc[2])};
    decode_k4_scales<FormatQ4_K>(load_u32x16(p.dm), t, s);
  }
};

template <>
struct Packed16Reader<FormatQ6_K> {
  static constexpr bool kPacked = true;
  using Block = PackedQ6_K;
  // Block j = 4h + k: low nibble k / 2 of ql[h][8 (k % 2) + g], bits 2k .. 2k + 1 of qh[h][g].
  static __m512i quant(const Block& p, int j, int g) {
    const int h = j / 4, k = j % 4;
    const __m512i ql = _mm512_loadu_si512(p.ql[h][8 * (k % 2) + g]);
    const __m512i qh = _mm512_loadu_si512(p.qh[h][g]);
    const __m512i low = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * (k / 2))),
                                         _mm512_set1_epi8(15));
    const __m512i high = _mm512_and_si512(
        _mm512_slli_epi16(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), 4), _mm512_set1_epi8(0x30));
    return _mm512_or_si512(low, high);
  }
  static void scales(const Block& p, ColumnScales* s) {
    const __m512 d = _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.d)));
    const __m512i sc[4] = {load_u32x16(p.sc[0]), load_u32x16(p.sc[1]), load_u32x16(p.sc[2]),
                           load_u32x16(p.sc[3])};
    decode_q6_k_scales(d, sc, s);
  }
};

// pack_panel16 from the packed layout: the quants are already interleaved, so a panel block is
// 8 stores of u rows and the scales (missing columns are the layout's zero columns). b0 is a
// multiple of F::kBlocksPer.
template <typename F>
void pack_panel16_packed(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int64_t b0, int64_t n_blocks,
                         Panel16* panel) {
  using R = Packed16Reader<F>;
  constexpr int kPer = F::kBlocksPer;
  const auto* blocks = reinterpret_cast<const typename R::Block*>(w + c0 * w_row_bytes);
  ColumnScales s[kPer];
  for (int64_t i = 0; i < n_blocks; ++i) {
    const int64_t b = b0 + i;
    const auto& block = blocks[b / kPer];
    const int j = static_cast<int>(b % kPer);
    if (j == 0) {
      // The GEMM's first touch of these weights: with few rows (a verification step past
      // gemv_packed's rows) it waits on memory unless the stream is asked for ahead.
      prefetch_packed(&block);
      R::scales(block, s);
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) _mm512_store_si512(panel[i].u[g], R::quant(block, j, g));
    _mm512_store_ps(panel[i].scale[0], s[j].scale0);
    _mm512_store_ps(panel[i].scale[1], s[j].scale1);
    _mm512_store_ps(panel[i].coef_s, s[j].coef_s);
    _mm512_store_ps(panel[i].coef_s_lo, s[j].coef_s_lo);
  }
}

// A panel chunk from whichever layout the avx512 / amx tables keep F's weights in.
template <typename F>
void pack_panel16_any(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int nc, int64_t b0, int64_t n_blocks,
                      Panel16* panel) {
  if constexpr (Packed16Reader<F>::kPacked) {
    pack_panel16_packed<F>(w, w_row_bytes, c0, b0, n_blocks, panel);
  } else {
    pack_panel16<F>(w, w_row_bytes, c0, nc, b0, n_blocks, panel);
  }
}

}  // namespace
}  // namespace ember::cpu
