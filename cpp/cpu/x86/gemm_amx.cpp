// cpu/x86/gemm_amx.cpp: prefill GEMM for quantized weights on Intel AMX (AMX-TILE + AMX-INT8), and the
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
// behind it. So a block costs tile work + epilogue: 1.25x the avx512 GEMM's speed (2048 x 5632
// x 512 rows, 1 thread), which computes the types with per-16 scales faster than AMX did (kGemms).
#include <algorithm>
#include <cstring>

#include "cpu/cpu_features.h"
#include "cpu/gemm.h"
#include "cpu/x86/gemm_pack_avx512.h"
#include "cpu/x86/weight_pack_avx512.h"

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

// Tile registers (the types with one scale per block; see kGemms):
//   tmm0 / tmm1  C: int32 [16][16] dots of an even / odd block
//   tmm2 / tmm3  A: int8 [16][32] activation quants of that block
//   tmm4 / tmm5  B: uint8 [8][16 x 4] the panel block's u
constexpr TileConfig make_config() {
  TileConfig c{};
  c.palette_id = 1;
  auto set = [&c](int tile, int n_rows, int n_bytes) {
    c.rows[tile] = static_cast<uint8_t>(n_rows);
    c.colsb[tile] = static_cast<uint16_t>(n_bytes);
  };
  for (int i = 0; i < 2; ++i) {
    set(0 + i, kTileRows, 64);
    set(2 + i, kTileRows, 32);
    set(4 + i, 8, 64);
  }
  return c;
}

// In read-only memory: GCC's _tile_loadconfig tells the compiler it reads only 8 bytes, so a
// config built on the stack right before could lose the rest of its stores.
constexpr TileConfig kConfig = make_config();

// One 32-element block of a 16-row activation tile: what the GEMM reads of BlockQ8A, laid out so
// the quants load as one A tile (512 contiguous bytes) and d / s broadcast per row.
// The tiled activations are [ceil(n_rows / 16) tiles][n_in / 32 blocks] ActTileBlock; rows past
// n_rows are zero.
struct ActTileBlock {
  int8_t qs[kTileRows][32];
  float d[kTileRows];
  float s[kTileRows];
};
static_assert(sizeof(ActTileBlock) == 640 && sizeof(ActTileBlock) % 64 == 0);

int64_t act_tiles_bytes(int64_t n_rows, int64_t n_in) {
  return (n_rows + kTileRows - 1) / kTileRows * (n_in / 32) * int64_t(sizeof(ActTileBlock));
}

void pack_act_tiles(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in,
                    int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  for_each_tile_row<kTileRows, ActTileBlock>(act, act_row_bytes, n_rows, n_in, tile_begin, tile_end, out,
                                             [](ActTileBlock& dst, int r, const BlockQ8A* a) {
                                               if (a == nullptr) {  // past n_rows
                                                 std::memset(dst.qs[r], 0, 32);
                                                 dst.d[r] = dst.s[r] = 0.0f;
                                                 return;
                                               }
                                               std::memcpy(dst.qs[r], a->qs, 32);
                                               dst.d[r] = a->d;
                                               dst.s[r] = a->s;
                                             });
}

// int32 dots of one block for one row tile: [16 rows][16 columns].
struct BlockDots {
  alignas(64) int32_t v[kTileRows][kCols];
};

// The tile work of one block (activations a, weights p) into the C tile of parity kOdd.
template <bool kOdd>
inline void block_dots(const ActTileBlock& a, const Panel16& p) {
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
}

// The C tile of parity kOdd to `out`.
template <bool kOdd>
inline void store_dots(BlockDots* out) {
  if constexpr (!kOdd) {
    _tile_stored(0, out->v, 64);
  } else {
    _tile_stored(1, out->v, 64);
  }
}

// As gemm_avx512.cpp.
inline __m512 to_float(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xffff, v); }

// acc[r] += block b's contribution to output row r: exactly tile_quant's float operations, in
// its order.
template <int R>
inline void block_epilogue(const BlockDots& dots, const Panel16& p, const ActTileBlock& a, __m512* acc) {
  const __m512 scale0 = _mm512_load_ps(p.scale[0]);
  const __m512 coef_s = _mm512_load_ps(p.coef_s);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 dot = to_float(_mm512_load_si512(dots.v[r]));
    acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale0, _mm512_set1_ps(a.d[r])), acc[r]);
    acc[r] = _mm512_fmadd_ps(coef_s, _mm512_set1_ps(a.s[r]), acc[r]);
  }
}

// y[R rows][nc of 16 cols] (row stride ldy) (+)= the first R rows of one activation tile
// (tiles[n_blocks]) · panel over n_blocks blocks; accumulate adds to what y holds (later K
// chunks). The tile work always covers 16 rows (a last tile's padding rows are zero).
template <int R>
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
  BlockDots dots[2];
  block_dots<false>(tiles[0], panel[0]);
  store_dots<false>(&dots[0]);
  for (int64_t b = 0; b < n_blocks; b += 2) {
    const bool has_odd = b + 1 < n_blocks;
    if (has_odd) {
      block_dots<true>(tiles[b + 1], panel[b + 1]);
      store_dots<true>(&dots[1]);
    }
    block_epilogue<R>(dots[0], panel[b], tiles[b], acc);
    if (has_odd) {
      if (b + 2 < n_blocks) {
        block_dots<false>(tiles[b + 2], panel[b + 2]);
        store_dots<false>(&dots[0]);
      }
      block_epilogue<R>(dots[1], panel[b + 1], tiles[b + 1], acc);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

using AmxTileFn = void (*)(const Panel16*, int64_t, const ActTileBlock*, float*, int64_t, int, bool);

constexpr AmxTileFn kAmxTiles[kTileRows + 1] = {
    nullptr,      tile_amx<1>,  tile_amx<2>,  tile_amx<3>,  tile_amx<4>,  tile_amx<5>,
    tile_amx<6>,  tile_amx<7>,  tile_amx<8>,  tile_amx<9>,  tile_amx<10>, tile_amx<11>,
    tile_amx<12>, tile_amx<13>, tile_amx<14>, tile_amx<15>, tile_amx<16>};

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
  static_assert(!F::kSub16);
  _tile_loadconfig(&kConfig);
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
        kAmxTiles[nr](panel, n_chunk, tiles + (r0 / kTileRows) * n_blocks + kb, g.y + r0 * g.ldy + c0, g.ldy,
                      nc, kb > 0);
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
// The types with one scale per 32-element block. Those with per-16 scales (q2_k, q3_k, q6_k) keep
// the avx512 GEMM: two TDPBSUDs and tile stores per block made AMX ~1.1x faster than avx512's
// old row-by-row tile, and slower than its group-major one (9640ab0): q6_k 2048 x 5632 x 512
// rows, 1 thread, 116-120 GFLOP/s here against 160-167 (q4_0 / q4_k / q8_0 / q4_1: 255-268
// against 202-211).
constexpr GemmEntry kGemms[] = {
    entry<FormatQ4_0, DType::q4_0>(), entry<FormatQ4_1, DType::q4_1>(), entry<FormatQ5_0, DType::q5_0>(),
    entry<FormatQ5_1, DType::q5_1>(), entry<FormatQ8_0, DType::q8_0>(), entry<FormatIQ4_NL, DType::iq4_nl>(),
    entry<FormatQ4_K, DType::q4_k>(), entry<FormatQ5_K, DType::q5_k>(),
};

IsaKernels make_table() {
  // Detection asks Linux for the process's AMX permission; without it the first tile
  // instruction faults. Callers check isa_supported(IsaLevel::amx) first, which detects, but a
  // table reached directly must not depend on that.
  (void)cpu_features();
  IsaKernels t = isa_kernels_avx512();
  t.level = IsaLevel::amx;
  t.act_tiling = {kTileRows, kMinRows, 0, act_tiles_bytes, pack_act_tiles};
  for (const GemmEntry& e : kGemms) {
    t.types[static_cast<uint32_t>(e.type)].gemm = e.fn;
    t.types[static_cast<uint32_t>(e.type)].act_tiled = true;
  }
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
