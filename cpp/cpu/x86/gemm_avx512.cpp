// cpu/x86/gemm_avx512.cpp: prefill GEMM on AVX-512 + VNNI. Weight columns are packed 16 at a time
// (layout: PanelBlock in gemm_pack_x86.h), all of K at once, and R x 16 tiles of outputs are
// computed over the panel: per 32-element block, 8 vpdpbusd per row (16 columns x 4 elements
// against the row's broadcast 4-byte activation group), group by group across the R rows, then
// per row one float scale and the min / offset terms. R <= 12: 12 float accumulators + 12 int32
// dots + a weight vector and temporaries fit the 32 zmm registers.
#include <algorithm>
#include <array>
#include <utility>

#include "cpu/gemm.h"
#include "cpu/x86/gemm_pack_avx512.h"
#include "cpu/x86/weight_pack_avx512.h"

namespace ember::cpu {
namespace {

constexpr int kCols = 16;
constexpr int kMaxRows = 12;
using Panel = Panel16;

// _mm512_cvtepi32_ps spelled through its zero-masked form: GCC 12 warns (falsely) about the
// undefined pass-through operand of the plain intrinsic.
inline __m512 to_float(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xffff, v); }

// dot + the 16 column dots of u (unsigned weight bytes) with activation group g of a (four signed
// bytes, broadcast): one vpdpbusd whose broadcast comes from memory ({1to16}). GCC 12 does not fold
// _mm512_set1_epi32 of a load into vpdpbusd, and the separate vpbroadcastd per row and group was a
// third of the GEMM tile's instructions.
inline __m512i dot_group(__m512i dot, __m512i u, const BlockQ8A& a, int g) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(dot)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(a.qs + 4 * g)));
  return dot;
}

// dot[r] += the int32 dots of groups [G0, G0 + N) of a block of panel p with rows[r]'s block:
// one vpdpbusd per group and row, group-major, so that the R rows' chains are independent and
// each step of every chain waits on nothing but its own last step.
template <int G0, int N, int R>
inline void group_dots(const Panel& p, const BlockQ8A* const* rows, int64_t b, __m512i* dot) {
#pragma GCC unroll 8
  for (int g = G0; g < G0 + N; ++g) {
    const __m512i w = _mm512_load_si512(p.u[g]);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) dot[r] = dot_group(dot[r], w, rows[r][b], g);
  }
}

// y[R rows][nc of 16 cols] (row stride ldy) = act[R rows] · panel over n_blocks blocks. Per
// block, all R rows' integer dots first (R independent vpdpbusd chains, the weight vector loaded
// once per group), then each row's float steps. Computing a row's block dot in one go instead
// (two chains of four for the 8 groups, rows one after another) kept the dependent chains in the
// scheduler and measured 9.1 cycles a row-block against 6.6 this way (L1-resident panel, 12
// rows, one thread, Sapphire Rapids; per-16 types 10.3 against 8.6). The int32 sums are exact,
// so the order changes no bit.
template <int R, bool kSub16>
void tile_quant(const Panel* panel, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
                int64_t ldy, int nc) {
  const __mmask16 mask = static_cast<__mmask16>((1u << nc) - 1);
  __m512 acc[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const BlockQ8A* rows[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Panel& p = panel[b];
    if constexpr (kSub16) {
      __m512i lo[R], hi[R];
      __m512 t[R];
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
      group_dots<0, 4, R>(p, rows, b, lo);
      const __m512 scale0 = _mm512_load_ps(p.scale[0]);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) t[r] = _mm512_mul_ps(to_float(lo[r]), scale0);
      group_dots<4, 4, R>(p, rows, b, hi);
      const __m512 scale1 = _mm512_load_ps(p.scale[1]);
      const __m512 coef_s = _mm512_load_ps(p.coef_s), coef_s_lo = _mm512_load_ps(p.coef_s_lo);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const BlockQ8A& a = rows[r][b];
        t[r] = _mm512_fmadd_ps(to_float(hi[r]), scale1, t[r]);
        acc[r] = _mm512_fmadd_ps(t[r], _mm512_set1_ps(a.d), acc[r]);
        acc[r] = _mm512_fmadd_ps(coef_s, _mm512_set1_ps(a.s), acc[r]);
        acc[r] = _mm512_fmadd_ps(coef_s_lo, _mm512_set1_ps(a.s_lo), acc[r]);
      }
    } else {
      __m512i dot[R];
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      group_dots<0, 8, R>(p, rows, b, dot);
      const __m512 scale0 = _mm512_load_ps(p.scale[0]), coef_s = _mm512_load_ps(p.coef_s);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const BlockQ8A& a = rows[r][b];
        acc[r] = _mm512_fmadd_ps(to_float(dot[r]), _mm512_mul_ps(scale0, _mm512_set1_ps(a.d)), acc[r]);
        acc[r] = _mm512_fmadd_ps(coef_s, _mm512_set1_ps(a.s), acc[r]);
      }
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

using QuantTileFn = void (*)(const Panel*, int64_t, const uint8_t*, int64_t, float*, int64_t, int);

template <bool kSub16>
constexpr QuantTileFn kQuantTiles[kMaxRows + 1] = {nullptr,
                                                   tile_quant<1, kSub16>,
                                                   tile_quant<2, kSub16>,
                                                   tile_quant<3, kSub16>,
                                                   tile_quant<4, kSub16>,
                                                   tile_quant<5, kSub16>,
                                                   tile_quant<6, kSub16>,
                                                   tile_quant<7, kSub16>,
                                                   tile_quant<8, kSub16>,
                                                   tile_quant<9, kSub16>,
                                                   tile_quant<10, kSub16>,
                                                   tile_quant<11, kSub16>,
                                                   tile_quant<12, kSub16>};

// --- few rows (decode) --------------------------------------------------------------------
// Below kGemmSmallRows rows, packing panels costs more than the rows' arithmetic. gemv_panel
// computes tile_quant's outputs without packing: each column's block dot is one vpdpbusd on the
// block as stored (8 int32 lanes, lanes 0-3 = elements 0..15) and a tree of hadds sums eight
// columns' lanes at once. The int32 sums are exact, so they equal the GEMM's; the scales come
// from the ColumnScaleReader that pack_panel16 stores in the panels; and the float steps are
// tile_quant's, in its order. Every output is bit-identical to the GEMM's: a row's result does
// not depend on how many rows came with it.
constexpr int64_t kGemmSmallRows = 4;

// Sums of elements 0..15 (lo) and 16..31 (hi) of eight columns' block dots v[0..7].
inline void sum_columns8(const __m256i v[8], __m256i* lo, __m256i* hi) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i g0 = _mm256_hadd_epi32(h01, h23);  // [c0..c3 lo | c0..c3 hi]
  const __m256i g1 = _mm256_hadd_epi32(h45, h67);  // [c4..c7 lo | c4..c7 hi]
  *lo = _mm256_permute2x128_si256(g0, g1, 0x20);
  *hi = _mm256_permute2x128_si256(g0, g1, 0x31);
}

inline __m512i join(__m256i low, __m256i high) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i x = _mm512_mask_inserti64x4(zero, 0xff, zero, low, 0);
  return _mm512_mask_inserti64x4(x, 0xff, x, high, 1);
}

template <typename F, int R>
void gemv_panel(const GemmArgs& g, int64_t c0, int nc) {
  static_assert(kColumnScales<F>);
  const int64_t n_blocks = g.n_in / 32;
  const __mmask16 mask = static_cast<__mmask16>((1u << nc) - 1);
  const uint8_t* cols[kCols];  // weight rows of the panel's columns (missing ones repeat the last)
  alignas(64) int32_t offsets[kCols];
  for (int c = 0; c < kCols; ++c) {
    cols[c] = g.w + (c0 + std::min(c, nc - 1)) * g.w_row_bytes;
    offsets[c] = static_cast<int32_t>((cols[c] - cols[0]));
  }
  ColumnScaleReader<F> scales{cols[0], _mm512_load_si512(offsets), {}};
  const BlockQ8A* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(g.act + r * g.act_row_bytes);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  constexpr int64_t kBlockBytes = sizeof(typename F::Block);

  for (int64_t b = 0; b < n_blocks; ++b) {
    // Each column is a stream of its own: ask for the byte ~1 KiB ahead of this block (a 32-element
    // block is at most 34 bytes, so every line of the stream is asked for).
    const int64_t ahead = b * kBlockBytes / F::kBlocksPer + 1024;
    for (int c = 0; c < nc; ++c) _mm_prefetch(reinterpret_cast<const char*>(cols[c]) + ahead, _MM_HINT_T0);
    __m256i qa[R];  // the rows' activation quants of block b
    for (int r = 0; r < R; ++r) qa[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r][b].qs));
    __m256i lo8[2][R], hi8[2][R];  // [columns 0..7, 8..15][row]
    for (int half = 0; half < 2; ++half) {
      __m256i v[R][8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i u = quants_x86(F{}, cols[8 * half + j], b);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) v[r][j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, qa[r]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) sum_columns8(v[r], &lo8[half][r], &hi8[half][r]);
    }
    const ColumnScales& s = scales.at(b);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {  // tile_quant's float steps
      const BlockQ8A& a = rows[r][b];
      const __m512i lo = join(lo8[0][r], lo8[1][r]), hi = join(hi8[0][r], hi8[1][r]);
      if constexpr (F::kSub16) {
        __m512 t = _mm512_mul_ps(to_float(lo), s.scale0);
        t = _mm512_fmadd_ps(to_float(hi), s.scale1, t);
        acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.d), acc[r]);
        acc[r] = _mm512_fmadd_ps(s.coef_s, _mm512_set1_ps(a.s), acc[r]);
        acc[r] = _mm512_fmadd_ps(s.coef_s_lo, _mm512_set1_ps(a.s_lo), acc[r]);
      } else {
        const __m512 dot = to_float(_mm512_add_epi32(lo, hi));
        acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s.scale0, _mm512_set1_ps(a.d)), acc[r]);
        acc[r] = _mm512_fmadd_ps(s.coef_s, _mm512_set1_ps(a.s), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(g.y + r * g.ldy + c0, mask, acc[r]);
}

// gemv_panel on the packed layout (weight_pack.h): a 32-element block of 16 columns is 8 u
// vectors that vpdpbusd takes as they are, against each row's broadcast 4-byte groups:
// tile_quant's integer work and float steps, without its panel. A thread's columns are one
// contiguous stream, read once: the prefetch asks for the bytes kPackedPrefetchBytes ahead.
template <typename F, int R>
void gemv_packed(const GemmArgs& g, int64_t c0, int nc) {
  using Reader = Packed16Reader<F>;
  using Block = typename Reader::Block;
  constexpr int kPer = F::kBlocksPer;
  // Up to 4 rows, each row's block dot is two chains of four vpdpbusd (one chain of eight would
  // wait on itself); from 5 rows on the rows' chains are independent enough, and one chain per
  // row leaves registers for the u vectors and accumulators. The int32 sums are exact either way.
  constexpr int kChains = R <= 4 ? 2 : 1;
  const int64_t n_super = g.n_in / 32 / kPer;
  const __mmask16 mask = static_cast<__mmask16>((1u << nc) - 1);
  const auto* blocks = reinterpret_cast<const Block*>(g.w + c0 * g.w_row_bytes);  // [n_super]
  const BlockQ8A* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(g.act + r * g.act_row_bytes);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < n_super; ++sb) {
    prefetch_packed(blocks + sb);
    ColumnScales s[kPer];
    Reader::scales(blocks[sb], s);
#pragma GCC unroll 1
    for (int j = 0; j < kPer; ++j) {
      const int64_t b = sb * kPer + j;
      // tile_quant's integer and float steps, group by group across the rows.
      if constexpr (F::kSub16) {
        __m512i lo[R], hi[R];
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m512i u = Reader::quant(blocks[sb], j, k);
#pragma GCC unroll 12
          for (int r = 0; r < R; ++r) {
            __m512i& d = k < 4 ? lo[r] : hi[r];
            d = dot_group(d, u, rows[r][b], k);
          }
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const BlockQ8A& a = rows[r][b];
          __m512 t = _mm512_mul_ps(to_float(lo[r]), s[j].scale0);
          t = _mm512_fmadd_ps(to_float(hi[r]), s[j].scale1, t);
          acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.d), acc[r]);
          acc[r] = _mm512_fmadd_ps(s[j].coef_s, _mm512_set1_ps(a.s), acc[r]);
          acc[r] = _mm512_fmadd_ps(s[j].coef_s_lo, _mm512_set1_ps(a.s_lo), acc[r]);
        }
      } else {
        __m512i dot[kChains][R];
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          for (int c = 0; c < kChains; ++c) dot[c][r] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m512i u = Reader::quant(blocks[sb], j, k);
#pragma GCC unroll 12
          for (int r = 0; r < R; ++r) {
            __m512i& d = dot[k % kChains][r];
            d = dot_group(d, u, rows[r][b], k);
          }
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const BlockQ8A& a = rows[r][b];
          __m512i sum = dot[0][r];
          if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, dot[1][r]);
          acc[r] = _mm512_fmadd_ps(to_float(sum), _mm512_mul_ps(s[j].scale0, _mm512_set1_ps(a.d)), acc[r]);
          acc[r] = _mm512_fmadd_ps(s[j].coef_s, _mm512_set1_ps(a.s), acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(g.y + r * g.ldy + c0, mask, acc[r]);
}

// Weights packed at load need no panels: gemv_packed takes up to kGemvMaxRows rows in one pass
// (more would spill the accumulators: the one-scale types keep two vectors a row, the per-16 ones
// three), which is at least as fast as the GEMM, whose panel copy costs as much as a tile of a few rows.
// Matmul ms, 1 thread (CPU time, kernel_bench N_IN N_OUT 1 rows=..., two or three runs, GEMM ->
// gemv): q4_1 576 x 1536 (SmolLM2) 5 rows 0.056 -> 0.034-0.048, 12 rows 0.102-0.156 ->
// 0.079-0.092; 2048 x 5632 at 9 / 12 rows q4_0 1.15-1.16 -> 0.77-0.90 / 1.42-1.48 -> 1.17-1.21,
// q8_0 1.13-1.41 -> 1.16-1.43 / 1.70-1.72 -> 1.52-1.64, q4_k 0.94-1.36 -> 0.74-1.12 / 1.14-1.85 ->
// 0.93-1.53; q8_0 576 x 49152 (SmolLM2's output layer) 12 rows 3.79-3.99 -> 2.01-3.16; q6_k at
// 4-8 rows even. Two passes (each unpacking the nibbles again) lost to the GEMM for the 4-bit
// types (q4_1 576 x 1536 10 rows 0.057-0.080 -> 0.094-0.096).
template <typename F>
constexpr int kGemvMaxRows = F::kSub16 ? 8 : 12;

// Up to this many rows, packed types go in passes of kGemvMaxRows (gemm_quant).
constexpr int64_t kGemvPassMaxRows = 24;

template <typename F>
constexpr int64_t gemv_row_limit() {
  return Packed16Reader<F>::kPacked ? kGemvMaxRows<F> + 1 : kGemmSmallRows;
}

template <typename F, size_t... I>
constexpr auto gemv_packed_table(std::index_sequence<I...>) {
  return std::array<void (*)(const GemmArgs&, int64_t, int), sizeof...(I)>{gemv_packed<F, int(I) + 1>...};
}

template <typename F>
void gemv_quant(const GemmArgs& g) {
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    if constexpr (Packed16Reader<F>::kPacked) {
      static constexpr auto table = gemv_packed_table<F>(std::make_index_sequence<kGemvMaxRows<F>>());
      table[g.n_rows - 1](g, c0, nc);
    } else {
      switch (g.n_rows) {
        case 1: gemv_panel<F, 1>(g, c0, nc); break;
        case 2: gemv_panel<F, 2>(g, c0, nc); break;
        default: gemv_panel<F, 3>(g, c0, nc); break;
      }
    }
  }
}

// A thread packs one panel of all n_in and runs every row tile over it. Packing and computing K
// chunk by chunk instead (16 blocks, 12 KB, so that the chunk stayed in L1) read each row tile's
// activations as 12 short runs 16 blocks long, one row's stride apart, which the prefetchers
// follow poorly: whole panels measured 10-29% faster (Zen 5, kernel_bench 2048 5632 and 5632
// 2048, q4_0, 1 and 2 threads, medians of 5-6 interleaved runs); the AVX2 GEMM packs whole panels
// too.
// Every output is the same float sequence over the blocks either way: the bits do not change.
template <typename F>
void gemm_quant(const GemmArgs& g) {
  if (g.n_rows < gemv_row_limit<F>()) return gemv_quant<F>(g);
  if constexpr (Packed16Reader<F>::kPacked) {
    // A few more rows than one pass takes (speculative verification of up to 16 drafts): passes of
    // kGemvMaxRows rows over the packed weights beat packing panels. Matmul ms, 1 thread pinned
    // (CPU time, kernel_bench N_IN N_OUT 1 rows=..., two runs, Zen 4, GEMM -> passes) at 17 / 24
    // rows: q8_0 576 x 49152 (SmolLM2's output layer) 4.9-5.2 -> 3.4-3.5 / 6.2-7.0 -> 4.9-5.2,
    // q4_1 576 x 1536 0.107 -> 0.100 / 0.145 -> 0.142; 2048 x 5632 q4_0 1.43 -> 1.23 / 1.92 ->
    // 1.75, q8_0 1.53 -> 1.24 / 2.06 -> 1.78, q4_k 1.45 -> 1.44 / 1.94 -> 1.85, q6_k 1.99-2.02 ->
    // 2.07 / 2.84 -> 2.60.
    if (g.n_rows <= kGemvPassMaxRows) {
      for (int64_t r0 = 0; r0 < g.n_rows; r0 += kGemvMaxRows<F>) {
        GemmArgs part = g;
        part.act = g.act + r0 * g.act_row_bytes;
        part.y = g.y + r0 * g.ldy;
        part.n_rows = std::min<int64_t>(kGemvMaxRows<F>, g.n_rows - r0);
        gemv_quant<F>(part);
      }
      return;
    }
  }
  const int64_t n_blocks = g.n_in / 32;
  auto* panel = static_cast<Panel*>(g.panel);
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    pack_panel16_any<F>(g.w, g.w_row_bytes, c0, nc, 0, n_blocks, panel);
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kMaxRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kMaxRows, g.n_rows - r0));
      kQuantTiles<F::kSub16>[nr](panel, n_blocks, g.act + r0 * g.act_row_bytes, g.act_row_bytes,
                                 g.y + r0 * g.ldy + c0, g.ldy, nc);
    }
  }
}

// Float activations in tiles of up to kMaxRows rows (float_tiling): tile t holds rows
// r0 = t * kMaxRows .. r0 + R - 1 (R = kMaxRows but in the last tile) as [n_in][R], from float
// r0 * n_in on, so that the R values the R rows' FMAs broadcast for one element share a cache line.
// Read from R rows n_in floats apart instead, each a stream of its own, the tiles of 11 and 12
// rows ran far slower: kernel_bench f16 4096 x 16384, 2 threads, Zen 4, two alternating runs, ms
// rows apart / tiled: 8 rows 5.0-5.2 / 5.1, 12 rows 9.5-9.7 / 7.1, 16 rows 12.2 / 9.7-9.8, 24
// rows 19.0 / 14.0-14.1, pp512 168-172 -> 226 GFLOP/s; the 1.1B f16 (n_in 2048, 5632) pp512
// 93-95 -> 102-113 t/s. Where 12 rows fit L1 the rows serve as well, and packing the tiles took
// 3% of SmolLM2 f16's (n_in 576) 8-row verification steps (perf), so rows shorter than
// kFloatTileMinIn stay as they are.
constexpr int64_t kFloatTileMinIn = 1024;

int64_t float_tiles_bytes(int64_t n_rows, int64_t n_in) { return n_rows * n_in * int64_t(sizeof(float)); }

void pack_float_tiles(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in,
                      int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = t * kMaxRows, n = std::min<int64_t>(kMaxRows, n_rows - r0);
    float* tile = reinterpret_cast<float*>(out) + r0 * n_in;
    const auto* rows = reinterpret_cast<const float*>(act + r0 * act_row_bytes);
    const int64_t ldx = act_row_bytes / int64_t(sizeof(float));
    for (int64_t k = 0; k < n_in; ++k) {
      for (int64_t r = 0; r < n; ++r) tile[k * n + r] = rows[r * ldx + k];
    }
  }
}

// Float weights, packed at load (weight_pack.h: a column group is [n_in][16] values, the panel
// itself): y[R][16] = x[R][k] * group[k][16], one broadcast FMA per row and element, in k order
// from zero, so a row's result does not depend on the rows that come with it. x: a tile of
// pack_float_tiles (kTiled), else rows ldx floats apart. Load converts 16 values.
template <typename Load, bool kTiled, int R>
void tile_float(const uint8_t* group, int64_t n_in, const float* x, int64_t ldx, float* y, int64_t ldy,
                int nc) {
  __m512 acc[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n_in; ++k) {
    // The group is one contiguous stream: ask for the bytes kPackedPrefetchBytes ahead.
    _mm_prefetch(reinterpret_cast<const char*>(group) + k * kCols * Load::kBytes + kPackedPrefetchBytes,
                 _MM_HINT_T0);
    const __m512 w = Load::load16(group, k);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(kTiled ? x[k * R + r] : x[r * ldx + k]), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << nc) - 1);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

using FloatTileFn = void (*)(const uint8_t*, int64_t, const float*, int64_t, float*, int64_t, int);
template <typename Load, bool kTiled, size_t... R>
constexpr std::array<FloatTileFn, kMaxRows + 1> float_tiles(std::index_sequence<R...>) {
  return {nullptr, tile_float<Load, kTiled, int(R) + 1>...};
}
// kFloatTiles<Load, kTiled>[R]: the tile of R rows.
template <typename Load, bool kTiled>
constexpr auto kFloatTiles = float_tiles<Load, kTiled>(std::make_index_sequence<kMaxRows>());

template <typename Load>
void gemm_float(const GemmArgs& g) {
  const auto* tiles = reinterpret_cast<const float*>(g.act_tiles);
  const auto* x = reinterpret_cast<const float*>(g.act);
  const int64_t ldx = g.act_row_bytes / static_cast<int64_t>(sizeof(float));
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    const uint8_t* group = g.w + c0 * g.w_row_bytes;  // column group c0 / 16 of the packed layout
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kMaxRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kMaxRows, g.n_rows - r0));
      float* y = g.y + r0 * g.ldy + c0;
      if (tiles) {
        kFloatTiles<Load, true>[nr](group, g.n_in, tiles + r0 * g.n_in, 0, y, g.ldy, nc);
      } else {
        kFloatTiles<Load, false>[nr](group, g.n_in, x + r0 * ldx, ldx, y, g.ldy, nc);
      }
    }
  }
}

struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  static __m512 load16(const uint8_t* group, int64_t k) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(group) + k * kCols);
  }
};
struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  static __m512 load16(const uint8_t* group, int64_t k) {
    return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group) + k));
  }
};
struct LoadBF16 {
  static constexpr int64_t kBytes = 2;
  // bf16 is the top half of an f32: widen and shift, exact. (Zero-masked forms here and in
  // LoadF16: GCC 12 warns, falsely, about the plain intrinsics' undefined pass-through operand.)
  static __m512 load16(const uint8_t* group, int64_t k) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group) + k);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
  }
};

}  // namespace

WeightPackFn gemm_weight_packer_avx512(DType type) {
  switch (type) {  // the types with a Packed16Reader, and the floats (gemm_float)
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q8_0:
    case DType::q4_k:
    case DType::q6_k: return weight_packer(type);
    default: return nullptr;
  }
}

GemmFn gemm_kernel_avx512(DType type) {
  switch (type) {
    case DType::f32: return gemm_float<LoadF32>;
    case DType::f16: return gemm_float<LoadF16>;
    case DType::bf16: return gemm_float<LoadBF16>;
    default: break;
  }
  GemmFn fn = nullptr;
  for_each_block_format([&](DType t, auto format) {
    if (t == type) fn = gemm_quant<decltype(format)>;
  });
  return fn;
}

ActTiling float_tiling_avx512() {
  return {kMaxRows, 1, kFloatTileMinIn, float_tiles_bytes, pack_float_tiles};
}

int64_t panel_bytes_avx512(int64_t n_in) { return static_cast<int64_t>(sizeof(Panel)) * (n_in / 32); }

}  // namespace ember::cpu
