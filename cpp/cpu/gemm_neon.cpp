// cpu/gemm_neon.cpp: matmul on aarch64 NEON + dotprod for the types kept in the packed layout
// (weight_pack.h: q4_0, q4_1, q8_0), every row count: one packed block of 16 columns is, per
// 4-element group g, 4 vectors of 4 columns x 4 quants, and `sdot` by lane multiplies each with
// group g of an activation row (lane g % 4 of its 16-byte half). Decode streams the packed
// weights once; prefill tiles 4 rows over each block, so one weight read serves 4 rows.
// Every row runs the same operations whatever the row count, so rows are batch-invariant.
// (Types without a packed layout keep vec_dot.)
#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "cpu/gemm.h"
#include "cpu/weight_pack.h"

namespace ember::cpu {
namespace {

constexpr int kCols = kPackCols;
constexpr int kMaxRows =
    4;  // 4 x 4 int32 and 4 x 4 float accumulators, 4 weight vectors, 8 activation halves

// The f16 lanes [4v, 4v + 4) of h as f32.
inline float32x4_t half4(const uint16_t* h, int v) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * v)));
}

// Per format: the signed quants of group g for columns 4v .. 4v + 3 (q = u - kBias), and the
// block's scale and min (zero for formats without one) of those columns.
struct NeonQ4_0 {
  using Block = PackedQ4_0;
  static constexpr bool kMin = false;
  static int8x16_t quants(const Block& p, int g, int v) {
    const uint8x16_t x = vld1q_u8(p.qs[g % 4][4 * v]);
    const uint8x16_t u = g < 4 ? vandq_u8(x, vdupq_n_u8(15)) : vshrq_n_u8(x, 4);
    return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(8));
  }
  static float32x4_t scale(const Block& p, int v) { return half4(p.d, v); }
  static float32x4_t min(const Block&, int) { return vdupq_n_f32(0.0f); }
};

struct NeonQ4_1 {
  using Block = PackedQ4_1;
  static constexpr bool kMin = true;
  static int8x16_t quants(const Block& p, int g, int v) {
    const uint8x16_t x = vld1q_u8(p.qs[g % 4][4 * v]);
    return vreinterpretq_s8_u8(g < 4 ? vandq_u8(x, vdupq_n_u8(15)) : vshrq_n_u8(x, 4));
  }
  static float32x4_t scale(const Block& p, int v) { return half4(p.d, v); }
  static float32x4_t min(const Block& p, int v) { return half4(p.m, v); }
};

struct NeonQ8_0 {
  using Block = PackedQ8_0;
  static constexpr bool kMin = false;
  static int8x16_t quants(const Block& p, int g, int v) {
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p.u[g][4 * v]), vdupq_n_u8(128)));
  }
  static float32x4_t scale(const Block& p, int v) { return half4(p.d, v); }
  static float32x4_t min(const Block&, int) { return vdupq_n_f32(0.0f); }
};

// dot[r][v] += group G of the block's columns 4v .. 4v + 3 times group G of row r (sdot's lane
// is a compile-time constant, hence the template).
template <typename N, int R, int G>
inline void group_dots(const typename N::Block& p, const int8x16_t (&a)[R][2], int32x4_t (&dot)[R][4]) {
  for (int v = 0; v < 4; ++v) {
    const int8x16_t w = N::quants(p, G, v);
    for (int r = 0; r < R; ++r) dot[r][v] = vdotq_laneq_s32(dot[r][v], w, a[r][G / 4], G % 4);
  }
}

// y[R rows][nc of 16 columns] = act[R rows] · the group's blocks[n_blocks]:
// per block, int32 dots exact, then acc += dot * (d_w * d_a) (+ min_w * s_a).
template <typename N, int R>
void tile(const typename N::Block* blocks, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes,
          float* y, int64_t ldy, int nc) {
  const BlockQ8A* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.0f);
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const typename N::Block& p = blocks[b];
    __builtin_prefetch(reinterpret_cast<const char*>(&p) + 2048);
    __builtin_prefetch(reinterpret_cast<const char*>(&p) + 2048 + 64);
    __builtin_prefetch(reinterpret_cast<const char*>(&p) + 2048 + 128);
    __builtin_prefetch(reinterpret_cast<const char*>(&p) + 2048 + 192);
    __builtin_prefetch(reinterpret_cast<const char*>(&p) + 2048 + 256);
    int8x16_t a[R][2];
    for (int r = 0; r < R; ++r) {
      a[r][0] = vld1q_s8(rows[r][b].qs);
      a[r][1] = vld1q_s8(rows[r][b].qs + 16);
    }
    int32x4_t dot[R][4];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < 4; ++v) dot[r][v] = vdupq_n_s32(0);
    }
    [&]<int... G>(std::integer_sequence<int, G...>) { (group_dots<N, R, G>(p, a, dot), ...); }
    (std::make_integer_sequence<int, 8>{});
    for (int v = 0; v < 4; ++v) {
      const float32x4_t d = N::scale(p, v);
      const float32x4_t m = N::min(p, v);
      for (int r = 0; r < R; ++r) {
        const BlockQ8A& x = rows[r][b];
        acc[r][v] = vfmaq_f32(acc[r][v], vcvtq_f32_s32(dot[r][v]), vmulq_n_f32(d, x.d));
        if constexpr (N::kMin) acc[r][v] = vfmaq_n_f32(acc[r][v], m, x.s);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float out[kCols];
    for (int v = 0; v < 4; ++v) vst1q_f32(out + 4 * v, acc[r][v]);
    std::memcpy(y + r * ldy, out, sizeof(float) * nc);
  }
}

template <typename N>
void gemm_packed(const GemmArgs& g) {
  using Block = typename N::Block;
  using TileFn = void (*)(const Block*, int64_t, const uint8_t*, int64_t, float*, int64_t, int);
  constexpr TileFn kTiles[kMaxRows + 1] = {nullptr, tile<N, 1>, tile<N, 2>, tile<N, 3>, tile<N, 4>};
  const int64_t n_blocks = g.n_in / 32;
  for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
    const int nc = static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0));
    const auto* blocks = reinterpret_cast<const Block*>(g.w + c0 * g.w_row_bytes);
    for (int64_t r0 = 0; r0 < g.n_rows; r0 += kMaxRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kMaxRows, g.n_rows - r0));
      kTiles[nr](blocks, n_blocks, g.act + r0 * g.act_row_bytes, g.act_row_bytes, g.y + r0 * g.ldy + c0,
                 g.ldy, nc);
    }
  }
}

struct GemmEntry {
  DType type;
  GemmFn fn;
};
constexpr GemmEntry kGemms[] = {
    {DType::q4_0, gemm_packed<NeonQ4_0>},
    {DType::q4_1, gemm_packed<NeonQ4_1>},
    {DType::q8_0, gemm_packed<NeonQ8_0>},
};

}  // namespace

GemmFn gemm_kernel_neon(DType type) {
  for (const GemmEntry& e : kGemms) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

}  // namespace ember::cpu
