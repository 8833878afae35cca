// cpu/gemm_amx.cpp: prefill GEMM for quantized weights on Intel AMX (AMX-TILE + AMX-INT8), and the
// amx kernel table (the avx512 one with these GEMMs). Same weight panels and K chunks as
// gemm_avx512.cpp; per 32-element block, one TDPBSUD computes the int32 dots of 16 activation rows
// x 16 columns (A tile: the rows' quants from the tiled activations, see ActTileBlock; B tile: the
// panel block's u area, 8 rows of 16 columns x 4 quants), and a float epilogue then applies
// tile_quant's operations in tile_quant's order. The int32 dots are exact either way, so every
// output is the same float as the avx512 GEMM's: a row's result never depends on which path or
// batch computed it.
// Cost, measured on Sapphire Rapids: the tile work of one block and 16 x 16 tile (loads,
// TDPBSUD, the tile store) takes about as long as its epilogue's vector work, and the two barely
// overlap: a tile instruction that must wait (a store for its TDPBSUD) holds up the vector work
// behind it. So a block costs tile work + epilogue, ~1.4x faster than VNNI's 8 vpdpbusd per row
// (types with per-16 scales, two dots and stores per block: ~1.1x).
#include <algorithm>
#include <cstring>

#include "cpu/cpu_features.h"
#include "cpu/gemm.h"
#include "cpu/gemm_pack_avx512.h"
#include "cpu/weight_pack_avx512.h"

namespace ember::cpu {
namespace {

constexpr int kCols = 16;      // columns per panel = int32 lanes of one C tile row
constexpr int kTileRows = 16;  // activation rows per A / C tile
// Blocks per K chunk: 32 blocks of a panel (24 KB) and of one row tile's activations (22 KB) fit
// the 48 KB L1 together. Partial sums go through y between chunks (exact, so the chunk size
// never changes y); 32 measured 5-10% faster than avx512's 16 (fewer per-tile starts, fewer y
// round trips), 64 no better where n_in > 2048.
constexpr int64_t kChunkBlocks = 32;
// Below this many rows the avx512 GEMM is as fast (types with per-16 scales: faster): a row
// tile costs the same tile work for 1 or 16 rows, and the panel packing (shared by both)
// dominates. From 32 rows on amx leads, by ~25% at 64 rows (q4_0, q4_k; q6_k ~5%).
constexpr int64_t kMinRows = 32;

// LDTILECFG's 64-byte operand; palette 1 has 8 tiles of at most 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64);

// Tile registers. Types with one scale per block (kSub16 false):
//   tmm0 / tmm1  C: int32 [16][16] dots of an even / odd block
//   tmm2 / tmm3  A: int8 [16][32] activation quants of that block
//   tmm4 / tmm5  B: uint8 [8][16 x 4] the panel block's u
// Types with per-16 scales dot each half separately (as tile_quant's lo / hi), K = 16:
//   tmm0, tmm1  C lo, hi of an even block;  tmm2, tmm3  C lo, hi of an odd block
//   tmm4, tmm5  A lo, hi [16][16];          tmm6, tmm7  B lo, hi [4][16 x 4]
constexpr TileConfig make_config(bool sub16) {
  TileConfig c{};
  c.palette_id = 1;
  auto set = [&c](int tile, int n_rows, int n_bytes) {
    c.rows[tile] = static_cast<uint8_t>(n_rows);
    c.colsb[tile] = static_cast<uint16_t>(n_bytes);
  };
  if (!sub16) {
    for (int i = 0; i < 2; ++i) {
      set(0 + i, kTileRows, 64);
      set(2 + i, kTileRows, 32);
      set(4 + i, 8, 64);
    }
  } else {
    for (int i = 0; i < 4; ++i) set(i, kTileRows, 64);
    for (int i = 0; i < 2; ++i) {
      set(4 + i, kTileRows, 16);
      set(6 + i, 4, 64);
    }
  }
  return c;
}

// In read-only memory: GCC's _tile_loadconfig tells the compiler it reads only 8 bytes, so a
// config built on the stack right before could lose the rest of its stores.
constexpr TileConfig kConfigs[2] = {make_config(false), make_config(true)};  // [kSub16]

// One 32-element block of a 16-row activation tile: what the GEMM reads of BlockQ8A, laid out so
// the quants load as one A tile (512 contiguous bytes) and d / s / s_lo broadcast per row.
// The tiled activations are [ceil(n_rows / 16) tiles][n_in / 32 blocks] ActTileBlock; rows past
// n_rows are zero.
struct ActTileBlock {
  int8_t qs[kTileRows][32];
  float d[kTileRows];
  float s[kTileRows];
  float s_lo[kTileRows];
};
static_assert(sizeof(ActTileBlock) == 704 && sizeof(ActTileBlock) % 64 == 0);

int64_t act_tiles_bytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kTileRows - 1) / kTileRows * (n_in / 32) * int64_t(sizeof(ActTileBlock));
}

void pack_act_tiles(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in,
                    int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  const int64_t n_blocks = n_in / 32;
  auto* tiles = reinterpret_cast<ActTileBlock*>(out);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    ActTileBlock* dst = tiles + t * n_blocks;
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t row = t * kTileRows + r;
      if (row >= n_rows) {
        for (int64_t b = 0; b < n_blocks; ++b) {
          std::memset(dst[b].qs[r], 0, 32);
          dst[b].d[r] = dst[b].s[r] = dst[b].s_lo[r] = 0.0f;
        }
        continue;
      }
      const auto* src = reinterpret_cast<const BlockQ8A*>(act + row * act_row_bytes);
      for (int64_t b = 0; b < n_blocks; ++b) {
        std::memcpy(dst[b].qs[r], src[b].qs, 32);
        dst[b].d[r] = src[b].d;
        dst[b].s[r] = src[b].s;
        dst[b].s_lo[r] = src[b].s_lo;
      }
    }
  }
}

// int32 dots of one block for one row tile: [2 halves if kSub16][16 rows][16 columns].
template <bool kSub16>
struct BlockDots {
  alignas(64) int32_t v[kSub16 ? 2 : 1][kTileRows][kCols];
};

// The tile work of one block (activations a, weights p) into the C tiles of parity kOdd.
template <bool kSub16, bool kOdd>
inline void block_dots(const ActTileBlock& a, const Panel16& p) {
  if constexpr (!kSub16) {
    if constexpr (!kOdd) {
      _tile_loadd(2, a.qs, 32);
      _tile_loadd(4, p.u, 64);
      _tile_zero(0);
      _tile_dpbsud(0, 2, 4);
    } else {
      _tile_loadd(3, a.qs, 32);
      _tile_loadd(5, p.u, 64);
      _tile_zero(1);
      _tile_dpbsud(1, 3, 5);
    }
  } else {
    _tile_loadd(4, a.qs, 32);
    _tile_loadd(5, &a.qs[0][16], 32);
    _tile_loadd(6, p.u[0], 64);
    _tile_loadd(7, p.u[4], 64);
    if constexpr (!kOdd) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 5, 7);
    } else {
      _tile_zero(2);
      _tile_zero(3);
      _tile_dpbsud(2, 4, 6);
      _tile_dpbsud(3, 5, 7);
    }
  }
}

// The C tiles of parity kOdd to `out`.
template <bool kSub16, bool kOdd>
inline void store_dots(BlockDots<kSub16>* out) {
  if constexpr (!kSub16) {
    if constexpr (!kOdd) {
      _tile_stored(0, out->v[0], 64);
    } else {
      _tile_stored(1, out->v[0], 64);
    }
  } else {
    if constexpr (!kOdd) {
      _tile_stored(0, out->v[0], 64);
      _tile_stored(1, out->v[1], 64);
    } else {
      _tile_stored(2, out->v[0], 64);
      _tile_stored(3, out->v[1], 64);
    }
  }
}

// As gemm_avx512.cpp.
inline __m512 to_float(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xffff, v); }

// acc[r] += block b's contribution to output row r: exactly tile_quant's float operations, in
// its order.
template <int R, bool kSub16>
inline void block_epilogue(const BlockDots<kSub16>& dots, const Panel16& p, const ActTileBlock& a,
                           __m512* acc) {
  const __m512 scale0 = _mm512_load_ps(p.scale[0]);
  const __m512 coef_s = _mm512_load_ps(p.coef_s);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if constexpr (kSub16) {
      const __m512 lo = to_float(_mm512_load_si512(dots.v[0][r]));
      const __m512 hi = to_float(_mm512_load_si512(dots.v[1][r]));
      __m512 t = _mm512_mul_ps(lo, scale0);
      t = _mm512_fmadd_ps(hi, _mm512_load_ps(p.scale[1]), t);
      acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.d[r]), acc[r]);
      acc[r] = _mm512_fmadd_ps(coef_s, _mm512_set1_ps(a.s[r]), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_load_ps(p.coef_s_lo), _mm512_set1_ps(a.s_lo[r]), acc[r]);
    } else {
      const __m512 dot = to_float(_mm512_load_si512(dots.v[0][r]));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale0, _mm512_set1_ps(a.d[r])), acc[r]);
      acc[r] = _mm512_fmadd_ps(coef_s, _mm512_set1_ps(a.s[r]), acc[r]);
    }
  }
}

// y[R rows][nc of 16 cols] (row stride ldy) (+)= the first R rows of one activation tile
// (tiles[n_blocks]) · panel over n_blocks blocks; accumulate adds to what y holds (later K
// chunks). The tile work always covers 16 rows (a last tile's padding rows are zero).
template <int R, bool kSub16>
void tile_amx(const Panel16* panel, int64_t n_blocks, const ActTileBlock* tiles, float* y, int64_t ldy,
              int nc, bool accumulate) {
  const __mmask16 mask = static_cast<__mmask16>((1u << nc) - 1);
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    acc[r] = accumulate ? _mm512_maskz_loadu_ps(mask, y + r * ldy) : _mm512_setzero_ps();
  }
  // Block b + 1's tile work is issued before block b's epilogue (other orders, e.g. storing
  // block b + 1's dots only after block b's epilogue, measured the same).
  BlockDots<kSub16> dots[2];
  block_dots<kSub16, false>(tiles[0], panel[0]);
  store_dots<kSub16, false>(&dots[0]);
  for (int64_t b = 0; b < n_blocks; b += 2) {
    const bool has_odd = b + 1 < n_blocks;
    if (has_odd) {
      block_dots<kSub16, true>(tiles[b + 1], panel[b + 1]);
      store_dots<kSub16, true>(&dots[1]);
    }
    block_epilogue<R, kSub16>(dots[0], panel[b], tiles[b], acc);
    if (has_odd) {
      if (b + 2 < n_blocks) {
        block_dots<kSub16, false>(tiles[b + 2], panel[b + 2]);
        store_dots<kSub16, false>(&dots[0]);
      }
      block_epilogue<R, kSub16>(dots[1], panel[b + 1], tiles[b + 1], acc);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

using AmxTileFn = void (*)(const Panel16*, int64_t, const ActTileBlock*, float*, int64_t, int, bool);

template <bool kSub16>
constexpr AmxTileFn kAmxTiles[kTileRows + 1] = {nullptr,
                                                tile_amx<1, kSub16>,
                                                tile_amx<2, kSub16>,
                                                tile_amx<3, kSub16>,
                                                tile_amx<4, kSub16>,
                                                tile_amx<5, kSub16>,
                                                tile_amx<6, kSub16>,
                                                tile_amx<7, kSub16>,
                                                tile_amx<8, kSub16>,
                                                tile_amx<9, kSub16>,
                                                tile_amx<10, kSub16>,
                                                tile_amx<11, kSub16>,
                                                tile_amx<12, kSub16>,
                                                tile_amx<13, kSub16>,
                                                tile_amx<14, kSub16>,
                                                tile_amx<15, kSub16>,
                                                tile_amx<16, kSub16>};

// As gemm_avx512.cpp's gemm_quant: each column panel is packed one K chunk at a time, and every
// row tile passes over the chunk while it is in L1. (Making the K chunk the outer loop, so that
// a chunk's activations stay in L2 for every panel, measured no faster even where the tiled
// activations outgrow L2: y then streams through the caches once per chunk.) The tile
// configuration is per thread: loaded here, released before returning.
// Without tiled activations (matmuls of fewer than kMinRows rows) this is the avx512 GEMM,
// which gives the same bits.
template <typename F, DType kType>
void gemm_quant(const GemmArgs& g) {
  if (g.act_tiles == nullptr) {
    gemm_kernel_avx512(kType)(g);
    return;
  }
  const int64_t n_blocks = g.n_in / 32;
  auto* panel = static_cast<Panel16*>(g.panel);
  const auto* tiles = reinterpret_cast<const ActTileBlock*>(g.act_tiles);
  _tile_loadconfig(&kConfigs[F::kSub16]);
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    for (int64_t kb = 0; kb < n_blocks; kb += kChunkBlocks) {
      const int64_t n_chunk = std::min(kChunkBlocks, n_blocks - kb);
      pack_panel16_any<F>(g.w, g.w_row_bytes, c0, nc, kb, n_chunk, panel);
      // tileloadd's asm statement does not tell the compiler it reads memory: keep the panel's
      // stores before it.
      asm volatile("" ::: "memory");
      for (int64_t r0 = 0; r0 < g.n_rows; r0 += kTileRows) {
        const int nr = static_cast<int>(std::min<int64_t>(kTileRows, g.n_rows - r0));
        kAmxTiles<F::kSub16>[nr](panel, n_chunk, tiles + (r0 / kTileRows) * n_blocks + kb,
                                 g.y + r0 * g.ldy + c0, g.ldy, nc, kb > 0);
      }
    }
  }
  _tile_release();
}

struct GemmEntry {
  DType type;
  GemmFn fn;
};
template <typename F, DType kType>
constexpr GemmEntry entry() {
  return {kType, gemm_quant<F, kType>};
}
constexpr GemmEntry kGemms[] = {
    entry<FormatQ4_0, DType::q4_0>(), entry<FormatQ4_1, DType::q4_1>(), entry<FormatQ5_0, DType::q5_0>(),
    entry<FormatQ5_1, DType::q5_1>(), entry<FormatQ8_0, DType::q8_0>(), entry<FormatIQ4_NL, DType::iq4_nl>(),
    entry<FormatQ2_K, DType::q2_k>(), entry<FormatQ3_K, DType::q3_k>(), entry<FormatQ4_K, DType::q4_k>(),
    entry<FormatQ5_K, DType::q5_k>(), entry<FormatQ6_K, DType::q6_k>(),
};

IsaKernels make_table() {
  // Detection asks Linux for the process's AMX permission; without it the first tile
  // instruction faults. Callers check isa_supported(IsaLevel::amx) first, which detects, but a
  // table reached directly must not depend on that.
  (void)cpu_features();
  IsaKernels t = isa_kernels_avx512();
  t.level = IsaLevel::amx;
  t.act_tiling = {kTileRows, kMinRows, act_tiles_bytes, pack_act_tiles};
  for (const GemmEntry& e : kGemms) t.types[static_cast<uint32_t>(e.type)].gemm = e.fn;
  return t;
}

}  // namespace

GemmFn gemm_kernel_amx(DType type) {
  for (const GemmEntry& e : kGemms) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

// Float weights keep the avx512 GEMM (an AMX-BF16 one would round differently); quantized
// weights use the same panels as avx512, so the scratch size is avx512's.
const IsaKernels& isa_kernels_amx() {
  static const IsaKernels table = make_table();
  return table;
}

}  // namespace ember::cpu
