// cpu/x86/gemm_tiles_avx2.h: the AVX2 GEMM's micro-kernels: a tile of R activation rows times the
// 8 (or 16) columns a source gives, for the signed, unsigned and K-quant types, and the decode
// path that runs them straight from the packed layout. Included only by the AVX2 GEMM files (gemm_*avx2.cpp);
// internal linkage (see block_formats.h).
#pragma once

#include "cpu/x86/gemm_sources_avx2.h"

namespace ember::cpu {
namespace {

// Signed types, one block b of 8 columns (p.w[g]: q of group g) for R rows: acc[r] gains the
// block's dot times scale0 * d. Group-outer, so that beside the R int32 sums only the group's q
// and |q| are live: the sums never spill. A maddubs lane |q| |a| + |q| |a| reaches 2 * 128 * 127,
// so every group widens at once; the integer sums are exact, so their order leaves the bits
// alone, and the float operations are the unsigned types' (one fmadd of the converted dot by
// scale0 * d per block).
template <int R>
inline void signed_block(const Block8& p, const BlockQ8A* const* rows, int64_t b, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[R];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i abs_w = _mm256_sign_epi8(p.w[g], p.w[g]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i a = _mm256_sign_epi8(bcast_group(rows[r][b], g), p.w[g]);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, a), ones);
      sum[r] = g == 0 ? dot : _mm256_add_epi32(sum[r], dot);
      // Keeps each row's sum one chain: GCC would otherwise reassociate it into a tree that
      // holds all 8 groups' dots of every row at once, and spill.
      asm("" : "+x"(sum[r]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 dot = _mm256_cvtepi32_ps(sum[r]);
    acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(rows[r][b].d)), acc[r]);
  }
}

// Unsigned types, one block b of 8 columns (p: u and scales) for R rows: acc[r] gains the block's
// dot product with row r.
template <int R, typename F>
inline void unsigned_block(const Block8& p, const BlockQ8A* const* rows, int64_t b, __m256* acc) {
  static_assert(!kSigned<F>);
  constexpr int kGroups = groups_per_widen<F>();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i* w = p.w;
  if constexpr (kGroupOuter<F> && R >= kMaxRows) {  // the GEMM's tiles; decode keeps the row-outer order
    // Group-outer: one weight vector at a time against every row, so that beside the R int16
    // sums and R accumulators only it and a broadcast are live (the row-outer order keeps all 8).
    __m256i sum16[R];
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i prod = _mm256_maddubs_epi16(w[g], bcast_group(rows[r][b], g));
        sum16[r] = g == 0 ? prod : _mm256_add_epi16(sum16[r], prod);
        asm("" : "+x"(sum16[r]));  // one chain a row, as in signed_block
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ8A& a = rows[r][b];
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[r], ones));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(a.d)), acc[r]);
      acc[r] = _mm256_fmadd_ps(p.coef_s, _mm256_set1_ps(a.s), acc[r]);
    }
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const BlockQ8A& a = rows[r][b];
    // half[e]: Σ u a over elements 16e .. 16e + 15 where the halves have their own
    // scales (kSub16), else half[0] over all 32 (up to 8 groups summed in int16).
    constexpr int kParts = F::kSub16 ? 2 : 1, kPer = 8 / kParts;
    __m256i half[kParts];
#pragma GCC unroll 8
    for (int e = 0; e < kParts; ++e) {
      __m256i sum32 = _mm256_setzero_si256(), sum16 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = kPer * e; g < kPer * e + kPer; ++g) {
        const __m256i av = bcast_group(a, g);
        const __m256i prod = _mm256_maddubs_epi16(w[g], av);
        const int i = g - kPer * e;  // the group's place in its part
        sum16 = i % kGroups == 0 ? prod : _mm256_add_epi16(sum16, prod);
        if (i % kGroups == kGroups - 1 || i == kPer - 1) {
          sum32 = _mm256_add_epi32(sum32, _mm256_madd_epi16(sum16, ones));
        }
      }
      half[e] = sum32;
    }
    __m256& out = acc[r];
    if constexpr (F::kSub16) {
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(half[0]), p.scale0);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half[1]), p.scale1, t);
      out = _mm256_fmadd_ps(t, _mm256_set1_ps(a.d), out);
      out = _mm256_fmadd_ps(p.coef_s_lo, _mm256_set1_ps(a.s_lo), out);
    } else {
      const __m256 dot = _mm256_cvtepi32_ps(half[0]);
      out = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(a.d)), out);
    }
    out = _mm256_fmadd_ps(p.coef_s, _mm256_set1_ps(a.s), out);
  }
}

// rows[R]: the activation rows of a tile, act_row_bytes apart.
template <int R>
inline void tile_rows(const uint8_t* act, int64_t act_row_bytes, const BlockQ8A** rows) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
}

// The first nc[h] columns of half h's accumulators of each row into y (row stride ldy).
template <int R, int kHalves>
inline void store_tile(const __m256 (*acc)[R], float* y, int64_t ldy, const int* nc) {
  alignas(32) float out[kCols];
#pragma GCC unroll 2
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(out, acc[h][r]);
      std::memcpy(y + r * ldy + kCols * h, out, sizeof(float) * nc[h]);
    }
  }
}

// y[R][8 kHalves] = R activation rows · the columns sources[0..kHalves) give (8 each: the
// halves of one 16-column group in decode, so its bytes stream once with two independent
// accumulator chains); only the first nc[h] columns of half h are stored. Every column gets
// the same operations in the same order whatever R, kHalves or the source.
template <int R, int kHalves, typename F, typename Source>
void tile_quant(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
                int64_t ldy, const int* nc) {
  __m256 acc[kHalves][R];
#pragma GCC unroll 8
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
  }
  const BlockQ8A* rows[R];
  tile_rows<R>(act, act_row_bytes, rows);
  for (int64_t b = 0; b < n_blocks; ++b) {
    sources[0].prefetch(b);
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      Block8 p;
      sources[h].load(b, &p);
      if constexpr (kSigned<F>) {
        signed_block<R>(p, rows, b, acc[h]);
      } else {
        unsigned_block<R, F>(p, rows, b, acc[h]);
      }
    }
  }
  store_tile<R, kHalves>(acc, y, ldy, nc);
}

// K-quants, block j of the super-block at b0, for R rows and the kHalves column halves of the
// sources: isum[h][r] gains Σ_e sc_e Σ_{i in half e} u_i q_i (e: the block's scale halves;
// s[h]->sc[j]) of row r, exactly. Group by group across halves and rows, so that beside the sums
// only one group's u per half and one broadcast are live. In the GEMM's tiles each row's int16
// sum stays one chain (as in signed_block).
template <int R, int kHalves, typename F, typename Source>
inline void k_block(const uint8_t* const* at, const SuperK8* const* s, const BlockQ8A* const* rows,
                    int64_t b0, int j, __m256i (*isum)[R]) {
  constexpr int kGroups = groups_per_widen<F>();
  constexpr int kPer = F::kSub16 ? 4 : 8;  // groups per scale
  __m256i sum16[kHalves][R];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    __m256i w[kHalves];
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) w[h] = Source::quant(at[h], j, g);
    const int i = g % kPer;  // the group's place in its scale's half
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i a = bcast_group(rows[r][b0 + j], g);
#pragma GCC unroll 2
      for (int h = 0; h < kHalves; ++h) {
        const __m256i prod = _mm256_maddubs_epi16(w[h], a);
        sum16[h][r] = i % kGroups == 0 ? prod : _mm256_add_epi16(sum16[h][r], prod);
        if constexpr (R >= kMaxRows) asm("" : "+x"(sum16[h][r]));
      }
    }
    if (i % kGroups == kGroups - 1 || i == kPer - 1) {
#pragma GCC unroll 2
      for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          isum[h][r] = _mm256_add_epi32(isum[h][r], _mm256_madd_epi16(sum16[h][r], s[h]->sc[j][g / kPer]));
          // One chain too: GCC would otherwise reassociate the integer sum of the super-block's
          // 8-32 terms into a tree at its end and keep every term in memory until then.
          asm("" : "+x"(isum[h][r]));
        }
      }
    }
  }
}

// tile_quant for the K-quants: per super-block, the integer sums of its 8 blocks, then per row
// the blocks' coef terms and the one float step d_w d_a Σ, in that order whatever R, kHalves or
// the source.
template <int R, int kHalves, typename F, typename Source>
void tile_k(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
            int64_t ldy, const int* nc) {
  __m256 acc[kHalves][R];
#pragma GCC unroll 8
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
  }
  const BlockQ8A* rows[R];
  tile_rows<R>(act, act_row_bytes, rows);
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
    sources[0].prefetch(b0);
    SuperK8 scratch[kHalves];
    const SuperK8* s[kHalves];
    const uint8_t* at[kHalves];
    __m256i isum[kHalves][R];
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      s[h] = &sources[h].scales(b0, &scratch[h]);
      at[h] = sources[h].at(b0);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[h][r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) k_block<R, kHalves, F, Source>(at, s, rows, b0, j, isum);
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const BlockQ8A* a = rows[r] + b0;
        __m256 t = acc[h][r];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          t = _mm256_fmadd_ps(s[h]->coef_s[j], _mm256_set1_ps(a[j].s), t);
          if constexpr (F::kSub16) t = _mm256_fmadd_ps(s[h]->coef_s_lo[j], _mm256_set1_ps(a[j].s_lo), t);
        }
        const __m256 scale = _mm256_mul_ps(s[h]->d, _mm256_set1_ps(a[0].d));
        acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][r]), scale, t);
      }
    }
  }
  store_tile<R, kHalves>(acc, y, ldy, nc);
}

// The tile of a type: tile_k for the K-quants, tile_quant for the rest.
template <int R, int kHalves, typename F, typename Source>
void tile(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
          int64_t ldy, const int* nc) {
  if constexpr (kSuperK<F>) {
    tile_k<R, kHalves, F>(sources, n_blocks, act, act_row_bytes, y, ldy, nc);
  } else {
    tile_quant<R, kHalves, F>(sources, n_blocks, act, act_row_bytes, y, ldy, nc);
  }
}

// fn.template operator()<R>() with R = n_rows, 1 <= n_rows <= kMax: a tile's row count as the
// template argument its tile_quant needs.
template <int kMax, int R = 1, typename Fn>
inline void with_rows(int n_rows, Fn&& fn) {
  if constexpr (R < kMax) {
    if (n_rows > R) return with_rows<kMax, R + 1>(n_rows, fn);
  }
  fn.template operator()<R>();
}

// Decode (1 .. kMaxRows - 1 rows) straight from the packed layout, columns [c0, c_end): whole
// 16-column groups in one pass each, a lone half (a range edge inside a group) alone.
template <int R, typename F>
void decode_packed(const GemmArgs& g, int64_t c0, int64_t c_end) {
  using Block = std::remove_cvref_t<PackedBlock<F>>;
  const int64_t n_blocks = g.n_in / 32;
  while (c0 < c_end) {
    const auto* blocks = reinterpret_cast<const Block*>(g.w + c0 / 16 * 16 * g.w_row_bytes);
    const int h = static_cast<int>(c0 % 16 / 8);
    const int nc[2] = {static_cast<int>(std::min<int64_t>(kCols, c_end - c0)),
                       static_cast<int>(std::clamp<int64_t>(c_end - c0 - kCols, 0, kCols))};
    if (h == 0 && nc[1] > 0) {  // the group's zero columns past n_out make the second half safe to read
      const PackedSource<F> sources[2] = {{blocks, 0}, {blocks, 1}};
      tile<R, 2, F>(sources, n_blocks, g.act, g.act_row_bytes, g.y + c0, g.ldy, nc);
      c0 += 2 * kCols;
    } else {
      const PackedSource<F> source{blocks, h};
      tile<R, 1, F>(&source, n_blocks, g.act, g.act_row_bytes, g.y + c0, g.ldy, nc);
      c0 += kCols;
    }
  }
}

// Decode-shaped calls (fewer than kMaxRows rows) of packed types: straight from the packed layout.
template <typename F>
void decode_rows(const GemmArgs& g) {
  switch (g.n_rows) {
    case 1: decode_packed<1, F>(g, g.col_begin, g.col_end); break;
    case 2: decode_packed<2, F>(g, g.col_begin, g.col_end); break;
    default: decode_packed<3, F>(g, g.col_begin, g.col_end); break;
  }
}

// Every row of g over the panel `panels` of columns c0 .. c0 + nc[0], in tiles of up to
// kTileRows<F> rows.
template <typename F, typename Source>
void panel_row_tiles(const GemmArgs& g, const Source& panels, int64_t n_blocks, int64_t c0, const int* nc) {
  constexpr int kRows = kTileRows<F>;
  for (int64_t r0 = 0; r0 < g.n_rows; r0 += kRows) {
    const uint8_t* act = g.act + r0 * g.act_row_bytes;
    float* y = g.y + r0 * g.ldy + c0;
    with_rows<kRows>(static_cast<int>(std::min<int64_t>(kRows, g.n_rows - r0)),
                     [&]<int R>() { tile<R, 1, F>(&panels, n_blocks, act, g.act_row_bytes, y, g.ldy, nc); });
  }
}

}  // namespace
}  // namespace ember::cpu
