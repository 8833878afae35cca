// cpu/x86/block_formats_x86.h: AVX2 twins of block_formats.h's quants(): one 32-element block as
// 32 unsigned bytes u = q + kBias, in element order. Included only by *_avx2.cpp / *_avx512.cpp
// files (their flags enable AVX2); internal linkage for the reason block_formats.h gives.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "cpu/block_formats.h"

namespace ember::cpu {
namespace {

// [32 bytes] low nibbles of p[0..16) then high nibbles.
inline __m256i nibbles_x86(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo_mask = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo_mask), _mm_and_si128(v, lo_mask));
}

// [32 bytes] byte i = 0xff if bit i of bits is set, else 0.
inline __m256i bits_to_bytes_x86(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

inline __m256i load32_x86(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __m256i quants_x86(FormatQ4_0, const void* row, int64_t b) {
  return nibbles_x86(static_cast<const BlockQ4_0*>(row)[b].qs);
}

inline __m256i quants_x86(FormatQ4_1, const void* row, int64_t b) {
  return nibbles_x86(static_cast<const BlockQ4_1*>(row)[b].qs);
}

inline __m256i quants_x86(FormatQ5_0, const void* row, int64_t b) {
  const BlockQ5_0& x = static_cast<const BlockQ5_0*>(row)[b];
  const __m256i high = _mm256_and_si256(bits_to_bytes_x86(load_u32(x.qh)), _mm256_set1_epi8(16));
  return _mm256_or_si256(nibbles_x86(x.qs), high);
}

inline __m256i quants_x86(FormatQ5_1, const void* row, int64_t b) {
  const BlockQ5_1& x = static_cast<const BlockQ5_1*>(row)[b];
  const __m256i high = _mm256_and_si256(bits_to_bytes_x86(load_u32(x.qh)), _mm256_set1_epi8(16));
  return _mm256_or_si256(nibbles_x86(x.qs), high);
}

inline __m256i quants_x86(FormatQ8_0, const void* row, int64_t b) {
  const BlockQ8_0& x = static_cast<const BlockQ8_0*>(row)[b];
  return _mm256_xor_si256(load32_x86(reinterpret_cast<const uint8_t*>(x.qs)), _mm256_set1_epi8(-128));
}

inline __m256i quants_x86(FormatIQ4_NL, const void* row, int64_t b) {
  // The codebook + 128, so the table lookup directly yields u.
  const __m256i table = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59,
                                         -39, -15, 1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90,
                                         -75, -59, -39, -15);
  return _mm256_shuffle_epi8(table, nibbles_x86(static_cast<const BlockIQ4_NL*>(row)[b].qs));
}

inline __m256i quants_x86(FormatQ2_K, const void* row, int64_t b) {
  const BlockQ2_K& x = static_cast<const BlockQ2_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const __m256i v = load32_x86(x.qs + 32 * (j / 4));
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (j % 4))), _mm256_set1_epi8(3));
}

inline __m256i quants_x86(FormatQ3_K, const void* row, int64_t b) {
  const BlockQ3_K& x = static_cast<const BlockQ3_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const __m256i v = load32_x86(x.qs + 32 * (j / 4));
  const __m256i low = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (j % 4))),
                                       _mm256_set1_epi8(3));
  // bit j of each hmask byte, moved to bit 2.
  const __m256i hm = load32_x86(x.hmask);
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
  const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit),
                                        _mm256_set1_epi8(4));
  return _mm256_or_si256(low, high);
}

inline __m256i quants_x86(FormatQ4_K, const void* row, int64_t b) {
  const BlockQ4_K& x = static_cast<const BlockQ4_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const __m256i v = load32_x86(x.qs + 32 * (j / 2));
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j % 2))), _mm256_set1_epi8(15));
}

inline __m256i quants_x86(FormatQ5_K, const void* row, int64_t b) {
  const BlockQ5_K& x = static_cast<const BlockQ5_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const __m256i v = load32_x86(x.qs + 32 * (j / 2));
  const __m256i low = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j % 2))),
                                       _mm256_set1_epi8(15));
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
  const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(load32_x86(x.qh), bit), bit),
                                        _mm256_set1_epi8(16));
  return _mm256_or_si256(low, high);
}

inline __m256i quants_x86(FormatQ6_K, const void* row, int64_t b) {
  const BlockQ6_K& x = static_cast<const BlockQ6_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8), h = j / 4, k = j % 4;
  const __m256i ql = load32_x86(x.ql + 64 * h + 32 * (k % 2));
  const __m256i qh = load32_x86(x.qh + 32 * h);
  const __m256i low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (k / 2))),
                                       _mm256_set1_epi8(15));
  const __m256i high = _mm256_and_si256(
      _mm256_sll_epi16(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm_cvtsi32_si128(4)),
      _mm256_set1_epi8(0x30));
  return _mm256_or_si256(low, high);
}

inline __m256i quants_x86(FormatMXFP4, const void* row, int64_t b) {
  // The codebook + 12, so the table lookup directly yields u.
  const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13,
                                         14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  return _mm256_shuffle_epi8(table, nibbles_x86(static_cast<const BlockMXFP4*>(row)[b].qs));
}

inline __m256i quants_x86(FormatTQ2_0, const void* row, int64_t b) {
  const BlockTQ2_0& x = static_cast<const BlockTQ2_0*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const __m256i v = load32_x86(x.qs + 32 * (j / 4));
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (j % 4))), _mm256_set1_epi8(3));
}

// [32 bytes] trit i of byte v[i]: ((uint8_t)(v[i] * pow3[i]) * 3) >> 8, in 16-bit lanes (no 8-bit
// multiply), even and odd bytes apart.
inline __m256i trits_x86(__m256i v, __m256i pow3) {
  const __m256i low = _mm256_set1_epi16(0x00ff), three = _mm256_set1_epi16(3);
  const __m256i q_even = _mm256_and_si256(
      _mm256_mullo_epi16(_mm256_and_si256(v, low), _mm256_and_si256(pow3, low)), low);
  const __m256i q_odd = _mm256_and_si256(
      _mm256_mullo_epi16(_mm256_srli_epi16(v, 8), _mm256_srli_epi16(pow3, 8)), low);
  const __m256i t_even = _mm256_srli_epi16(_mm256_mullo_epi16(q_even, three), 8);
  const __m256i t_odd = _mm256_andnot_si256(low, _mm256_mullo_epi16(q_odd, three));
  return _mm256_or_si256(t_even, t_odd);
}

inline __m256i quants_x86(FormatTQ1_0, const void* row, int64_t b) {
  const BlockTQ1_0& x = static_cast<const BlockTQ1_0*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  constexpr char kPow3[5] = {1, 3, 9, 27, 81};
  if (j < 5) return trits_x86(load32_x86(x.qs), _mm256_set1_epi8(kPow3[j]));
  const __m128i tail = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs + 32));
  if (j < 7) {
    const __m256i pow3 = _mm256_set_m128i(_mm_set1_epi8(kPow3[2 * (j - 5) + 1]),
                                          _mm_set1_epi8(kPow3[2 * (j - 5)]));
    return trits_x86(_mm256_set_m128i(tail, tail), pow3);
  }
  // Upper half: byte 4n + l is qh[l], taken to trit n.
  const __m128i qh = _mm_set1_epi32(static_cast<int>(load_u32(x.qh)));
  const __m256i pow3 = _mm256_set_m128i(_mm_setr_epi8(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27),
                                        _mm_set1_epi8(kPow3[4]));
  return trits_x86(_mm256_set_m128i(qh, tail), pow3);
}

// ---- i-quants: grid rows gathered by index, signs applied as byte masks, then + kBias.

// [32 bytes] v negated where bit i of sign_bits is set, plus bias.
inline __m256i signed_plus_bias_x86(__m256i v, uint32_t sign_bits, int bias) {
  const __m256i negated = _mm256_sub_epi8(_mm256_setzero_si256(), v);
  return _mm256_add_epi8(_mm256_blendv_epi8(v, negated, bits_to_bytes_x86(sign_bits)),
                         _mm256_set1_epi8(static_cast<char>(bias)));
}

inline __m256i rows8_x86(uint64_t r0, uint64_t r1, uint64_t r2, uint64_t r3) {
  return _mm256_set_epi64x(static_cast<int64_t>(r3), static_cast<int64_t>(r2), static_cast<int64_t>(r1),
                           static_cast<int64_t>(r0));
}

// The four expanded 7-bit sign indices of a u32 (iq2_xxs, iq3_xxs), sign of element 8l + j at bit 8l + j.
inline uint32_t ksigns_x86(uint32_t aux) {
  return kIqSigns[aux & 127] | uint32_t(kIqSigns[(aux >> 7) & 127]) << 8 |
         uint32_t(kIqSigns[(aux >> 14) & 127]) << 16 | uint32_t(kIqSigns[(aux >> 21) & 127]) << 24;
}

inline __m256i quants_x86(FormatIQ2_XXS, const void* row, int64_t b) {
  const BlockIQ2_XXS& x = static_cast<const BlockIQ2_XXS*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint32_t grid = iq_u32(&x.qs[4 * j]), aux = iq_u32(&x.qs[4 * j + 2]);
  const __m256i v = rows8_x86(kIq2xxsGrid[grid & 0xff], kIq2xxsGrid[(grid >> 8) & 0xff],
                              kIq2xxsGrid[(grid >> 16) & 0xff], kIq2xxsGrid[grid >> 24]);
  return signed_plus_bias_x86(v, ksigns_x86(aux), FormatIQ2_XXS::kBias);
}

inline __m256i quants_x86(FormatIQ2_XS, const void* row, int64_t b) {
  const BlockIQ2_XS& x = static_cast<const BlockIQ2_XS*>(row)[b / 8];
  const uint16_t* q = x.qs + 4 * (b % 8);
  const __m256i v = rows8_x86(kIq2xsGrid[q[0] & 511], kIq2xsGrid[q[1] & 511], kIq2xsGrid[q[2] & 511],
                              kIq2xsGrid[q[3] & 511]);
  const uint32_t signs = kIqSigns[q[0] >> 9] | uint32_t(kIqSigns[q[1] >> 9]) << 8 |
                         uint32_t(kIqSigns[q[2] >> 9]) << 16 | uint32_t(kIqSigns[q[3] >> 9]) << 24;
  return signed_plus_bias_x86(v, signs, FormatIQ2_XS::kBias);
}

inline __m256i quants_x86(FormatIQ2_S, const void* row, int64_t b) {
  const BlockIQ2_S& x = static_cast<const BlockIQ2_S*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* q = x.qs + 4 * j;
  const uint32_t h = x.qh[j];
  const __m256i v = rows8_x86(kIq2sGrid[q[0] | (h & 3) << 8], kIq2sGrid[q[1] | (h >> 2 & 3) << 8],
                              kIq2sGrid[q[2] | (h >> 4 & 3) << 8], kIq2sGrid[q[3] | (h >> 6 & 3) << 8]);
  return signed_plus_bias_x86(v, load_u32(x.signs + 4 * j), FormatIQ2_S::kBias);
}

inline __m256i quants_x86(FormatIQ3_XXS, const void* row, int64_t b) {
  const BlockIQ3_XXS& x = static_cast<const BlockIQ3_XXS*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* q = x.qs + 8 * j;
  const __m256i v = _mm256_setr_epi32(
      static_cast<int>(kIq3xxsGrid[q[0]]), static_cast<int>(kIq3xxsGrid[q[1]]),
      static_cast<int>(kIq3xxsGrid[q[2]]), static_cast<int>(kIq3xxsGrid[q[3]]),
      static_cast<int>(kIq3xxsGrid[q[4]]), static_cast<int>(kIq3xxsGrid[q[5]]),
      static_cast<int>(kIq3xxsGrid[q[6]]), static_cast<int>(kIq3xxsGrid[q[7]]));
  return signed_plus_bias_x86(v, ksigns_x86(iq_u32(x.qs + kQK_K / 4 + 4 * j)), FormatIQ3_XXS::kBias);
}

inline __m256i quants_x86(FormatIQ3_S, const void* row, int64_t b) {
  const BlockIQ3_S& x = static_cast<const BlockIQ3_S*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* q = x.qs + 8 * j;
  const uint32_t h = x.qh[j];
  alignas(32) uint32_t rows[8];
  for (int l = 0; l < 8; ++l) rows[l] = kIq3sGrid[q[l] | ((h >> l) & 1) << 8];
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(rows));
  return signed_plus_bias_x86(v, load_u32(x.signs + 4 * j), FormatIQ3_S::kBias);
}

// iq1: u = 8 * grid + (negative delta ? 8 : 10), the grid's -1 / 0 / 1 bytes times 8 by three
// byte adds; offsets holds each row's 8 or 10.
inline __m256i iq1_u_x86(__m256i grid, __m256i offsets) {
  const __m256i g2 = _mm256_add_epi8(grid, grid), g4 = _mm256_add_epi8(g2, g2);
  return _mm256_add_epi8(_mm256_add_epi8(g4, g4), offsets);
}

inline __m256i quants_x86(FormatIQ1_S, const void* row, int64_t b) {
  const BlockIQ1_S& x = static_cast<const BlockIQ1_S*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* q = x.qs + 4 * j;
  const uint32_t h = x.qh[j];
  const __m256i v = rows8_x86(kIq1sGrid[q[0] | (h & 7) << 8], kIq1sGrid[q[1] | (h >> 3 & 7) << 8],
                              kIq1sGrid[q[2] | (h >> 6 & 7) << 8], kIq1sGrid[q[3] | (h >> 9 & 7) << 8]);
  return iq1_u_x86(v, _mm256_set1_epi8(h & 0x8000 ? 8 : 10));
}

inline __m256i quants_x86(FormatIQ1_M, const void* row, int64_t b) {
  const BlockIQ1_M& x = static_cast<const BlockIQ1_M*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* q = x.qs + 4 * j;
  const uint32_t h = x.qh[2 * j] | uint32_t(x.qh[2 * j + 1]) << 8;  // nibble l: row l's bits
  const __m256i v = rows8_x86(kIq1sGrid[q[0] | (h & 7) << 8], kIq1sGrid[q[1] | (h >> 4 & 7) << 8],
                              kIq1sGrid[q[2] | (h >> 8 & 7) << 8], kIq1sGrid[q[3] | (h >> 12 & 7) << 8]);
  auto offset = [h](int l) -> int64_t {
    return (h >> (4 * l + 3)) & 1 ? 0x0808080808080808 : 0x0a0a0a0a0a0a0a0a;
  };
  return iq1_u_x86(v, _mm256_set_epi64x(offset(3), offset(2), offset(1), offset(0)));
}

// The formats without a vector twin (the i-quants' grid lookups): their scalar quants(), loaded.
template <typename F>
inline __m256i quants_x86(F, const void* row, int64_t b) {
  alignas(32) uint8_t u[32];
  F::quants(row, b, u);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(u));
}

// d (f16 bits) as f32 through F16C.
inline float f16_x86(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace
}  // namespace ember::cpu
