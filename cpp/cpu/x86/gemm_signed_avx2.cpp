// cpu/x86/gemm_signed_avx2.cpp: the AVX2 GEMM of the signed types (q8_0, iq4_nl, whose u can
// exceed 127 so maddubs would saturate): decode and up to kDirectMaxRows rows straight from the
// packed layout (signed_block), more rows through int16 pairs of weights and activations
// (gemm_wide) over activation tiles packed once per matmul (act_tiling_avx2).
#include "cpu/gemm.h"
#include "cpu/x86/gemm_avx2.h"
#include "cpu/x86/gemm_tiles_avx2.h"

namespace ember::cpu {
namespace {

// Packed signed types from kMaxRows to kDirectMaxRows rows, as decode_packed but in row tiles of
// up to kDirectRows: each 16-column group once, its row tiles one after the other (the group's
// blocks stay in cache for the later ones).
template <typename F>
void direct_packed(const GemmArgs& g) {
  static_assert(kSigned<F>);
  constexpr int kRows = kDirectRows;
  using Block = std::remove_cvref_t<PackedBlock<F>>;
  const int64_t n_blocks = g.n_in / 32;
  for (int64_t c0 = g.col_begin; c0 < g.col_end;) {
    const auto* blocks = reinterpret_cast<const Block*>(g.w + c0 / 16 * 16 * g.w_row_bytes);
    const int h = static_cast<int>(c0 % 16 / 8);
    const int nc[2] = {static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0)),
                       static_cast<int>(std::clamp<int64_t>(g.col_end - c0 - kCols, 0, kCols))};
    // The group's zero columns past n_out make the second half safe to read.
    const bool both = h == 0 && nc[1] > 0;
    const PackedSource<F> sources[2] = {{blocks, both ? 0 : h}, {blocks, 1}};
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kRows) {
      const uint8_t* act = g.act + r0 * g.act_row_bytes;
      float* y = g.y + r0 * g.ldy + c0;
      with_rows<kRows>(static_cast<int>(std::min<int64_t>(kRows, g.n_rows - r0)), [&]<int R>() {
        if (both) {
          tile_quant<R, 2, F>(sources, n_blocks, act, g.act_row_bytes, y, g.ldy, nc);
        } else {
          tile_quant<R, 1, F>(sources, n_blocks, act, g.act_row_bytes, y, g.ldy, nc);
        }
      });
    }
    c0 += both ? 2 * kCols : kCols;
  }
}

// Signed types' GEMM (from kMaxRows rows; packed q8_0 past kDirectMaxRows): products in int16.
// |q| <= 128 and |a| <= 127, so vpmaddwd multiplies pairs of elements straight into int32: 2
// operations per 16 MACs (madd, add) where the int8 form (signed_block) takes 4 per 32 (sign,
// maddubs, madd, add), and on Zen 4 three of those four share two pipes: loops of 16 independent
// sign, maddubs or madd take 2.2 ns alike, and 8 rows x 8 columns x 4 elements take 3.5 ns in the
// int8 form against 2.8 in this one (asm loops, activations broadcast from L1). The weight panel
// and the activation tiles (ActTiling, packed once per matmul) hold int16 pairs, twice the bytes.
// The block's int32 sums are the same integers as signed_block's and the float operations the
// same, so a row's result does not depend on the path. kernel_bench q8_0 pp, 1 thread, Zen 4,
// GFLOP/s over 5 alternating runs: 2048 x 5632 120-127 -> 141-146, iq4_nl 125-127 -> 141-145;
// 2 threads 2048 x 5632 235-251 -> 280-289, 5632 x 2048 247-250 -> 264-275.
constexpr int kWideRows = 8;

// One 32-element block of a tile of kWideRows activation rows: pairs[p][r] holds elements 2p and
// 2p + 1 of row r as int16 (the lower in the low half), d[r] its scale.
struct WideActBlock {
  int32_t pairs[16][kWideRows];
  float d[kWideRows];
};

// One 32-element block of 8 weight columns, as WideActBlock: pairs[p][c], scale[c].
struct WidePanelBlock {
  alignas(32) int32_t pairs[16][kCols];
  float scale[kCols];
};

int64_t wide_act_bytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kWideRows - 1) / kWideRows * (n_in / 32) * int64_t(sizeof(WideActBlock));
}

// ActTiling::pack of the layout: tiles [tile_begin, tile_end) of the BlockQ8A rows, rows past
// n_rows zero.
void pack_wide_act(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in,
                   int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  for_each_tile_row<kWideRows, WideActBlock>(
      act, act_row_bytes, n_rows, n_in, tile_begin, tile_end, out,
      [](WideActBlock& dst, int r, const BlockQ8A* a) {
        alignas(32) int32_t pairs[16] = {};  // elements 2p, 2p + 1 as int16, in the order they lie
        if (a != nullptr) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs));
          _mm256_store_si256(reinterpret_cast<__m256i*>(pairs),
                             _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
          _mm256_store_si256(reinterpret_cast<__m256i*>(pairs + 8),
                             _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
        }
#pragma GCC unroll 16
        for (int p = 0; p < 16; ++p) dst.pairs[p][r] = pairs[p];
        dst.d[r] = a != nullptr ? a->d : 0.0f;
      });
}

// wide[n_blocks] = panel[n_blocks] (a signed type's: q as int8) with its quants as int16 pairs.
void widen_panel(const Panel* panel, int64_t n_blocks, WidePanelBlock* wide) {
  for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      // Lane c: elements 4g .. 4g + 3 of column c, one byte each; as int16 words, word 0 holds
      // elements 4g, 4g + 1 and word 1 elements 4g + 2, 4g + 3.
      const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[b].u[g]));
      const __m256i low = _mm256_srai_epi16(_mm256_slli_epi16(q, 8), 8);  // each word's low byte
      const __m256i high = _mm256_srai_epi16(q, 8);                       // each word's high byte
      const __m256i even = _mm256_blend_epi16(low, _mm256_slli_epi32(high, 16), 0xaa);
      const __m256i odd = _mm256_blend_epi16(_mm256_srli_epi32(low, 16), high, 0xaa);
      _mm256_store_si256(reinterpret_cast<__m256i*>(wide[b].pairs[2 * g]), even);
      _mm256_store_si256(reinterpret_cast<__m256i*>(wide[b].pairs[2 * g + 1]), odd);
    }
    std::memcpy(wide[b].scale, panel[b].scale[0], sizeof(wide[b].scale));
  }
}

// y[R][nc] = the R rows of a tile · the panel's columns; per block the same float operations as
// signed_block (one fmadd of the converted dot by scale * d).
template <int R>
void tile_wide(const WidePanelBlock* panel, const WideActBlock* act, int64_t n_blocks, float* y, int64_t ldy,
               int nc) {
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const WidePanelBlock& w = panel[b];
    const WideActBlock& a = act[b];
    __m256i sum[R];
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m256i wp = _mm256_load_si256(reinterpret_cast<const __m256i*>(w.pairs[p]));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i prod = _mm256_madd_epi16(wp, _mm256_set1_epi32(a.pairs[p][r]));
        sum[r] = p == 0 ? prod : _mm256_add_epi32(sum[r], prod);
        asm("" : "+x"(sum[r]));  // one chain a row, as in signed_block
      }
    }
    const __m256 scale = _mm256_load_ps(w.scale);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(scale, _mm256_set1_ps(a.d[r])),
                               acc[r]);
    }
  }
  const __m256(*accs)[R] = &acc;
  store_tile<R, 1>(accs, y, ldy, &nc);
}

template <typename F>
void gemm_wide(const GemmArgs& g) {
  const int64_t n_blocks = g.n_in / 32;
  auto* panel = static_cast<Panel*>(g.panel);
  auto* wide = reinterpret_cast<WidePanelBlock*>(panel + n_blocks);
  const auto* tiles = reinterpret_cast<const WideActBlock*>(g.act_tiles);
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    pack_panel<F>(g, c0, nc, n_blocks, panel);
    widen_panel(panel, n_blocks, wide);
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kWideRows) {
      float* y = g.y + r0 * g.ldy + c0;
      const WideActBlock* act = tiles + r0 / kWideRows * n_blocks;
      with_rows<kWideRows>(static_cast<int>(std::min<int64_t>(kWideRows, g.n_rows - r0)),
                           [&]<int R>() { tile_wide<R>(wide, act, n_blocks, y, g.ldy, nc); });
    }
  }
}

// Signed types (q8_0, iq4_nl): below kMaxRows rows (packed: up to kDirectMaxRows) the tiles read
// the packed layout directly, from there on gemm_wide. All run the same integer dots and the same
// float operations on the same values, so a row's result never depends on the row count.
template <typename F>
void gemm_signed(const GemmArgs& g) {
  static_assert(kSigned<F>);
  if constexpr (kPacked<F>) {
    if (g.n_rows < kMaxRows) return decode_rows<F>(g);
    if (g.n_rows <= kDirectMaxRows) return direct_packed<F>(g);
  }
  gemm_wide<F>(g);
}

}  // namespace

GemmFn gemm_signed_avx2(DType type) {
  switch (type) {
    case DType::q8_0: return gemm_signed<FormatQ8_0>;
    case DType::iq4_nl: return gemm_signed<FormatIQ4_NL>;
    default: return nullptr;
  }
}

int64_t panel_bytes_signed_avx2(int64_t n_in) {
  return static_cast<int64_t>(sizeof(Panel) + sizeof(WidePanelBlock)) * (n_in / 32);  // gemm_wide's
}

// Every GEMM-shaped call of a signed type gets the tiles, also packed q8_0's up to kDirectMaxRows
// rows, which read the BlockQ8A rows instead: one threshold serves both types, and the unused
// tiles cost q8_0 nothing measurable (kernel_bench 2048 x 5632, 1 thread, 4 / 8 / 16 rows:
// 0.752 / 1.498 / 3.064 ms without them, 0.763 / 1.495 / 3.071 with).
ActTiling act_tiling_avx2() { return {kWideRows, kMaxRows, 0, wide_act_bytes, pack_wide_act}; }

bool gemm_act_tiled_avx2(DType type) { return type == DType::q8_0 || type == DType::iq4_nl; }

}  // namespace ember::cpu
