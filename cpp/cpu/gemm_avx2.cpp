// cpu/gemm_avx2.cpp: prefill GEMM on AVX2. Same panel scheme as gemm_avx512.cpp with 8 columns
// per panel and R <= 4 rows per tile (16 ymm registers). Products go through maddubs (u8 x s8 ->
// s16 pairs); as long as the s16 partial sums cannot saturate, several 4-element groups are added
// in 16 bits before one madd widens them to 32, which saves most of the widening work for the
// 2-5 bit types.
#include <algorithm>

#include "cpu/gemm.h"
#include "cpu/gemm_pack_x86.h"

namespace ember::cpu {
namespace {

constexpr int kCols = 8;
constexpr int kMaxRows = 4;
using Panel = PanelBlock<kCols>;
static_assert(sizeof(Panel) == 384);

// Types whose u can exceed 127 are packed signed (maddubs would saturate u * a pairs).
template <typename F>
constexpr bool kSigned = F::kMaxU > 127;

// 4-element groups that can be summed in int16: each maddubs lane is at most 2 * kMaxU * 127.
template <typename F>
constexpr int groups_per_widen() {
  if (kSigned<F>) return 1;
  const int per = 32767 / (2 * F::kMaxU * 127);
  return per >= 4 ? 4 : per >= 2 ? 2 : 1;
}

inline __m256i bcast_group(const BlockQ8A& a, int g) {
  int32_t v;
  std::memcpy(&v, a.qs + 4 * g, 4);
  return _mm256_set1_epi32(v);
}

template <int R, typename F>
void tile_quant(const Panel* panel, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes,
                float* y, int64_t ldy, int nc) {
  constexpr int kGroups = groups_per_widen<F>();
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const BlockQ8A* rows[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Panel& p = panel[b];
    __m256i w[8];
    #pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      w[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(p.u[g]));
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ8A& a = rows[r][b];
      __m256i half[2];
      #pragma GCC unroll 8
      for (int h = 0; h < 2; ++h) {
        __m256i sum32 = _mm256_setzero_si256(), sum16 = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int g = 4 * h; g < 4 * h + 4; ++g) {
          const __m256i av = bcast_group(a, g);
          __m256i prod;
          if constexpr (kSigned<F>) {
            prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(av, w[g]));
          } else {
            prod = _mm256_maddubs_epi16(w[g], av);
          }
          sum16 = (g % kGroups == 0) ? prod : _mm256_add_epi16(sum16, prod);
          if (g % kGroups == kGroups - 1) sum32 = _mm256_add_epi32(sum32, _mm256_madd_epi16(sum16, ones));
        }
        half[h] = sum32;
      }
      if constexpr (F::kSub16) {
        __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(half[0]), _mm256_load_ps(p.scale[0]));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half[1]), _mm256_load_ps(p.scale[1]), t);
        acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(a.d), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_load_ps(p.coef_s_lo), _mm256_set1_ps(a.s_lo), acc[r]);
      } else {
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(half[0], half[1]));
        acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(_mm256_load_ps(p.scale[0]), _mm256_set1_ps(a.d)), acc[r]);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_load_ps(p.coef_s), _mm256_set1_ps(a.s), acc[r]);
    }
  }
  alignas(32) float out[kCols];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r]);
    std::memcpy(y + r * ldy, out, sizeof(float) * nc);
  }
}

template <typename F>
void gemm_quant(const GemmArgs& g) {
  using TileFn = void (*)(const Panel*, int64_t, const uint8_t*, int64_t, float*, int64_t, int);
  constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile_quant<1, F>, tile_quant<2, F>,
                                           tile_quant<3, F>, tile_quant<4, F>};
  const int64_t n_blocks = g.n_in / 32;
  auto* panel = static_cast<Panel*>(g.panel);
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    pack_quant_panel<kCols, F, kSigned<F>>(g.w, g.w_row_bytes, c0, nc, n_blocks, panel);
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kMaxRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kMaxRows, g.n_rows - r0));
      kTiles[nr](panel, n_blocks, g.act + r0 * g.act_row_bytes, g.act_row_bytes,
                 g.y + r0 * g.ldy + c0, g.ldy, nc);
    }
  }
}

template <int R>
void tile_float(const float* panel, int64_t n_in, const float* x, int64_t ldx, float* y,
                int64_t ldy, int nc) {
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

struct GemmEntry {
  DType type;
  GemmFn fn;
};
constexpr GemmEntry kGemms[] = {
    {DType::f32, gemm_float<LoadF32>},         {DType::f16, gemm_float<LoadF16>},
    {DType::bf16, gemm_float<LoadBF16>},       {DType::q4_0, gemm_quant<FormatQ4_0>},
    {DType::q4_1, gemm_quant<FormatQ4_1>},     {DType::q5_0, gemm_quant<FormatQ5_0>},
    {DType::q5_1, gemm_quant<FormatQ5_1>},     {DType::q8_0, gemm_quant<FormatQ8_0>},
    {DType::iq4_nl, gemm_quant<FormatIQ4_NL>}, {DType::q2_k, gemm_quant<FormatQ2_K>},
    {DType::q3_k, gemm_quant<FormatQ3_K>},     {DType::q4_k, gemm_quant<FormatQ4_K>},
    {DType::q5_k, gemm_quant<FormatQ5_K>},     {DType::q6_k, gemm_quant<FormatQ6_K>},
};

}  // namespace

GemmFn gemm_kernel_avx2(DType type) {
  for (const GemmEntry& e : kGemms) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

int64_t panel_bytes_avx2(int64_t n_in) {
  return std::max<int64_t>(static_cast<int64_t>(sizeof(Panel)) * (n_in / 32),
                           static_cast<int64_t>(sizeof(float)) * kCols * n_in);
}

}  // namespace ember::cpu
