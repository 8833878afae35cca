// cpu/x86/gemm_avx2.cpp: prefill GEMM on AVX2. Same panel scheme as gemm_avx512.cpp with 8 columns
// per panel and R <= 4 rows per tile (16 ymm registers). Products go through maddubs (u8 x s8 ->
// s16 pairs); as long as the s16 partial sums cannot saturate, several 4-element groups are added
// in 16 bits before one madd widens them to 32, which saves most of the widening work for the
// 2-5 bit types. The 4-bit one-scale types sum a whole block in 16 bits and take it group by
// group across R <= 6 rows (kGroupOuter). The packed K-quants (q4_k, q6_k) sum a whole
// super-block in int32 with their integer scales against activations that share one scale per
// super-block (tile_k). Signed types (q8_0, iq4_nl) widen every group (signed_block) where they
// read the packed layout without a panel (decode, and packed q8_0 up to kDirectMaxRows rows); their
// GEMM multiplies int16 pairs of weights and activations instead (gemm_wide).
// This file: the unsigned and K-quant GEMMs and the avx2 GEMM table; the signed types' GEMM is
// gemm_signed_avx2.cpp's, the float types' gemm_float_avx2.cpp's, the tiles gemm_tiles_avx2.h's.
#include "cpu/x86/gemm_avx2.h"
#include "cpu/gemm.h"
#include "cpu/x86/gemm_tiles_avx2.h"

namespace ember::cpu {
namespace {

// The unsigned types. Packed ones: below kMaxRows rows the tiles read the packed layout directly
// (decode: the weights stream once, no panel), from there on through a panel packed from it. Both
// run the same integer dots and the same float operations on the same values, so a row's result
// never depends on the row count.
template <typename F>
void gemm_quant(const GemmArgs& g) {
  static_assert(!kSigned<F>);  // gemm_signed_avx2.cpp's
  if constexpr (kPacked<F>) {
    if (g.n_rows < kMaxRows) return decode_rows<F>(g);
  }
  const int64_t n_blocks = g.n_in / 32;
  auto* panel = static_cast<Panel*>(g.panel);
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc[1] = {static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0))};
    pack_panel<F>(g, c0, nc[0], n_blocks, panel);
    panel_row_tiles<F>(g, PanelSource{panel}, n_blocks, c0, nc);
  }
}

// The packed K-quants (ActFormat::q8a_k rows): as gemm_quant, through tile_k; the GEMM's panel is
// PanelSourceK's.
template <typename F>
void gemm_k(const GemmArgs& g) {
  if (g.n_rows < kMaxRows) return decode_rows<F>(g);
  const int64_t n_blocks = g.n_in / 32;
  auto* u = static_cast<PanelU*>(g.panel);
  auto* supers = reinterpret_cast<SuperK8*>(u + n_blocks);
  using Block = std::remove_cvref_t<PackedBlock<F>>;
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc[1] = {static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0))};
    const PackedSource<F> source{reinterpret_cast<const Block*>(g.w + c0 / 16 * 16 * g.w_row_bytes),
                                 static_cast<int>(c0 % 16 / 8)};
    pack_panel_k<F>(source, n_blocks, u, supers);
    panel_row_tiles<F>(g, PanelSourceK{u, supers}, n_blocks, c0, nc);
  }
}

}  // namespace

WeightPackFn gemm_weight_packer_avx2(DType type) {
  switch (type) {  // the types with a PackedSource (kPacked)
    case DType::q4_0:
    case DType::q4_1:
    case DType::q8_0:
    case DType::q4_k:
    case DType::q6_k: return weight_packer(type);
    default: return nullptr;
  }
}

bool gemm_sums_super_blocks_avx2(DType type) { return type == DType::q4_k || type == DType::q6_k; }

GemmFn gemm_kernel_avx2(DType type) {
  if (GemmFn fn = gemm_float_avx2(type)) return fn;
  if (GemmFn fn = gemm_signed_avx2(type)) return fn;
  GemmFn fn = nullptr;  // the unsigned types (the packed K-quants: gemm_k)
  for_each_block_format([&](DType t, auto format) {
    using F = decltype(format);
    if constexpr (kSuperK<F>) {
      if (t == type) fn = gemm_k<F>;
    } else if constexpr (!kSigned<F>) {
      if (t == type) fn = gemm_quant<F>;
    }
  });
  return fn;
}

// The largest scratch of any GEMM: the signed types' panel and its widened copy, the K-quants'
// panel (PanelU per block, SuperK8 per super-block), or a float panel.
int64_t panel_bytes_avx2(int64_t n_in) {
  const int64_t n_blocks = n_in / 32;
  const int64_t k_bytes = static_cast<int64_t>(sizeof(PanelU)) * n_blocks +
                          static_cast<int64_t>(sizeof(SuperK8)) * (n_blocks / 8);
  return std::max(
      {panel_bytes_signed_avx2(n_in), k_bytes, static_cast<int64_t>(sizeof(float)) * kCols * n_in});
}

}  // namespace ember::cpu
