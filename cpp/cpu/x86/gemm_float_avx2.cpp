// cpu/x86/gemm_float_avx2.cpp: the AVX2 GEMM of the float weight types (f32, f16, bf16): panels of
// 8 columns converted to f32, tiles of up to kMaxRows rows with one FMA chain per row.
#include "cpu/gemm.h"
#include "cpu/x86/gemm_avx2.h"
#include "cpu/x86/gemm_sources_avx2.h"

namespace ember::cpu {
namespace {

template <int R>
void tile_float(const float* panel, int64_t n_in, const float* x, int64_t ldx, float* y, int64_t ldy,
                int nc) {
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < n_in; ++k) {
    const __m256 w = _mm256_load_ps(panel + k * kCols);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_set1_ps(x[r * ldx + k]), acc[r]);
  }
  alignas(32) float out[kCols];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r]);
    std::memcpy(y + r * ldy, out, sizeof(float) * nc);
  }
}

template <typename Load>
void gemm_float(const GemmArgs& g) {
  using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int);
  constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile_float<1>, tile_float<2>, tile_float<3>,
                                           tile_float<4>};
  auto* panel = static_cast<float*>(g.panel);
  const auto* x = reinterpret_cast<const float*>(g.act);
  const int64_t ldx = g.act_row_bytes / static_cast<int64_t>(sizeof(float));
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    pack_float_panel<kCols, Load>(g.w, g.w_row_bytes, c0, nc, g.n_in, panel);
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kMaxRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kMaxRows, g.n_rows - r0));
      kTiles[nr](panel, g.n_in, x + r0 * ldx, ldx, g.y + r0 * g.ldy + c0, g.ldy, nc);
    }
  }
}

struct LoadF32 {
  static float load1(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct LoadF16 {
  static float load1(const void* w, int64_t i) { return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]); }
};
struct LoadBF16 {
  static float load1(const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); }
};

}  // namespace

GemmFn gemm_float_avx2(DType type) {
  switch (type) {
    case DType::f32: return gemm_float<LoadF32>;
    case DType::f16: return gemm_float<LoadF16>;
    case DType::bf16: return gemm_float<LoadBF16>;
    default: return nullptr;
  }
}

}  // namespace ember::cpu
