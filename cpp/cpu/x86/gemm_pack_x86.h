// cpu/x86/gemm_pack_x86.h: repacking NC weight rows (output columns) into the panel layout the x86
// GEMM micro-kernels read: for each 32-element block, the 32 quants of every column interleaved
// four at a time (one 32-bit lane per column holds 4 consecutive elements, which is what
// vpdpbusd / maddubs+madd consume against a broadcast 4-byte activation group), and the block's
// scales as NC-wide float vectors. A panel is packed once per matmul and then serves every
// activation row, so packing cost is amortised over n_rows.
// Included only by *_avx2.cpp / *_avx512.cpp; internal linkage (see block_formats.h).
#pragma once

#include <immintrin.h>

#include <cstring>

#include "cpu/quantize_act.h"
#include "cpu/x86/block_formats_x86.h"

namespace ember::cpu {
namespace {

// How far ahead a pass over packed weights asks for its stream (a thread's columns are one
// contiguous stream). Measured on the 1.1B Q4_0 / Q8_0 decode (Sapphire Rapids VM, 1 and 2
// threads, tg t/s): 1 KiB ahead 14, 2 KiB 16, 4 KiB 17.7, 8 KiB 17.6-19 (q4_0, 1 thread; q8_0
// and 2 threads alike).
constexpr int64_t kPackedPrefetchBytes = 8192;

// Asks for the packed block (weight_pack.h's layout, read by the avx2, avx512 and amx kernels)
// kPackedPrefetchBytes ahead of p, as one burst of its lines: into L1 for the one-block types
// (5-9 lines), into L2 for the K-quants' super-blocks (36-53 lines). A burst that large into L1
// stalled Zen 4's own loads: 4096 x 32000 decode, 1 thread (kernel_bench, GB/s, three runs each
// way, T0 -> T1): q6_k 8.2-10.0 -> 19.0-21.1, q4_k 15.6-18.5 -> 20.4-28.3, tinyllama Q4_K_M tg 1
// thread 21.8 -> 33.1 t/s (medians of 5 alternating runs); the one-block types gained nothing from
// L2 (q4_0 even, q8_0 0.87x).
template <typename Block>
inline void prefetch_packed(const Block* p) {
  constexpr auto kHint = sizeof(Block) > 1024 ? _MM_HINT_T1 : _MM_HINT_T0;
  const char* ahead = reinterpret_cast<const char*>(p) + kPackedPrefetchBytes;
  for (int64_t line = 0; line < int64_t(sizeof(Block)); line += 64) _mm_prefetch(ahead + line, kHint);
}

// ActTiling::pack's walk over BlockQ8A rows: tiles [tile_begin, tile_end) of kRows rows, each
// n_in / 32 Blocks (one 32-element block of the tile's rows) from out on; fn(block, r, a) for every
// row r of every block, a the row's BlockQ8A there, or nullptr for rows past n_rows.
template <int kRows, typename Block, typename Fn>
void for_each_tile_row(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in,
                       int64_t tile_begin, int64_t tile_end, uint8_t* out, Fn&& fn) {
  const int64_t n_blocks = n_in / 32;
  auto* tiles = reinterpret_cast<Block*>(out);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    Block* dst = tiles + t * n_blocks;
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = t * kRows + r;
      const auto* src = row < n_rows ? reinterpret_cast<const BlockQ8A*>(act + row * act_row_bytes) : nullptr;
      for (int64_t b = 0; b < n_blocks; ++b) fn(dst[b], r, src ? src + b : nullptr);
    }
  }
}

// One 32-element block of NC columns.
template <int NC>
struct PanelBlock {
  uint8_t u[8][NC][4];  // u[g][c][i]: element 4g + i of column c (u = q + bias, or q if signed)
  float scale[2][NC];   // per 16-element half
  float coef_s[NC];     // multiplies the activation block's s
  float coef_s_lo[NC];  // multiplies s_lo (only types with per-16 scales)
};

// panel[n_blocks] = columns [c0, c0 + nc) of w (nc <= NC; missing columns are zero).
// kSigned stores q = u - 128 as int8 (AVX2 path of the types whose u exceeds 127); otherwise u.
// With weight = scale * (u - kBias) + min, the block's contribution to a dot product is
//   d_a * Σ_h scale_h * Σ_{i in h} u_i a_i + Σ_h (min_h - kBias * scale_h) * d_a * Σ_{i in h} a_i,
// and coef_s / coef_s_lo hold the second sum rewritten over s and s_lo.
template <int NC, typename F, bool kSigned>
void pack_quant_panel(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int nc, int64_t n_blocks,
                      PanelBlock<NC>* panel) {
  constexpr int kBias = kSigned ? 0 : F::kBias;
  if (nc < NC) std::memset(static_cast<void*>(panel), 0, sizeof(PanelBlock<NC>) * n_blocks);
  for (int c = 0; c < nc; ++c) {
    const uint8_t* row = w + (c0 + c) * w_row_bytes;
    BlockScales scales[F::kBlocksPer];
    for (int64_t b = 0; b < n_blocks; ++b) {
      PanelBlock<NC>& p = panel[b];
      if (b % F::kBlocksPer == 0) F::scales_all(row, b / F::kBlocksPer, scales);
      const BlockScales& s = scales[b % F::kBlocksPer];
      __m256i u = quants_x86(F{}, row, b);
      if constexpr (kSigned) u = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
      alignas(32) uint32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), u);
      for (int g = 0; g < 8; ++g) std::memcpy(p.u[g][c], &lanes[g], 4);
      const float corr0 = s.min[0] - kBias * s.scale[0], corr1 = s.min[1] - kBias * s.scale[1];
      p.scale[0][c] = s.scale[0];
      p.scale[1][c] = s.scale[1];
      if constexpr (F::kSub16) {
        // corr0 * s_lo + corr1 * (s - s_lo) = corr1 * s + (corr0 - corr1) * s_lo
        p.coef_s[c] = corr1;
        p.coef_s_lo[c] = corr0 - corr1;
      } else {
        p.coef_s[c] = corr0;
        p.coef_s_lo[c] = 0.0f;
      }
    }
  }
}

// Float weights: panel[k][NC] = columns [c0, c0 + nc) of w as f32 (missing columns zero).
template <int NC, typename Load>
void pack_float_panel(const uint8_t* w, int64_t w_row_bytes, int64_t c0, int nc, int64_t n_in, float* panel) {
  if (nc < NC) std::memset(panel, 0, sizeof(float) * NC * n_in);
  for (int c = 0; c < nc; ++c) {
    const uint8_t* row = w + (c0 + c) * w_row_bytes;
    for (int64_t k = 0; k < n_in; ++k) panel[k * NC + c] = Load::load1(row, k);
  }
}

}  // namespace
}  // namespace ember::cpu
