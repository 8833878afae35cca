// cpu/arm/gemm_neon.cpp: matmul on aarch64 NEON + dotprod for the types kept in the packed layout
// (weight_pack.h: q4_0, q4_1, q8_0, q4_k, q6_k), every row count: one packed 32-element block of
// 16 columns is, per 4-element group g, 4 vectors of 4 columns x 4 quants, and `sdot` by lane
// multiplies each with group g of an activation row (lane g % 4 of its 16-byte half). Decode
// streams the packed weights once; prefill tiles 4 rows over each block, so one weight read
// serves 4 rows.
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

// Per format (kBlocksPer 32-element blocks per packed Block): quants(p, j, g, v) = the signed
// quants (q = u - kBias) of block j's group g for columns 4v .. 4v + 3, and scales(p, s) the
// scales of every block j: s->scale[j][e][v] per 16-element half e, s->min[j][v] (the min terms
// of formats with kMin). Formats with kSub16 have different scales for the two halves.
template <int kBlocksPer>
struct NeonScales {
  float32x4_t scale[kBlocksPer][2][4];
  float32x4_t min[kBlocksPer][4];
};

// The one-scale-per-block formats' scales (and mins): f16 fields of 16 columns.
inline void block_scales(const uint16_t* d, const uint16_t* m, NeonScales<1>* s) {
  for (int v = 0; v < 4; ++v) {
    s->scale[0][0][v] = s->scale[0][1][v] = half4(d, v);
    s->min[0][v] = m ? half4(m, v) : vdupq_n_f32(0.0f);
  }
}

struct NeonQ4_0 {
  using Block = PackedQ4_0;
  static constexpr int kBlocksPer = 1;
  static constexpr bool kMin = false, kSub16 = false;
  static int8x16_t quants(const Block& p, int, int g, int v) {
    const uint8x16_t x = vld1q_u8(p.qs[g % 4][4 * v]);
    const uint8x16_t u = g < 4 ? vandq_u8(x, vdupq_n_u8(15)) : vshrq_n_u8(x, 4);
    return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(8));
  }
  static void scales(const Block& p, NeonScales<1>* s) { block_scales(p.d, nullptr, s); }
};

struct NeonQ4_1 {
  using Block = PackedQ4_1;
  static constexpr int kBlocksPer = 1;
  static constexpr bool kMin = true, kSub16 = false;
  static int8x16_t quants(const Block& p, int, int g, int v) {
    const uint8x16_t x = vld1q_u8(p.qs[g % 4][4 * v]);
    return vreinterpretq_s8_u8(g < 4 ? vandq_u8(x, vdupq_n_u8(15)) : vshrq_n_u8(x, 4));
  }
  static void scales(const Block& p, NeonScales<1>* s) { block_scales(p.d, p.m, s); }
};

struct NeonQ8_0 {
  using Block = PackedQ8_0;
  static constexpr int kBlocksPer = 1;
  static constexpr bool kMin = false, kSub16 = false;
  static int8x16_t quants(const Block& p, int, int g, int v) {
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p.u[g][4 * v]), vdupq_n_u8(128)));
  }
  static void scales(const Block& p, NeonScales<1>* s) { block_scales(p.d, nullptr, s); }
};

// Byte k of the bytes that 4 columns' dwords t[k / 4] hold.
inline uint32x4_t byte4(const uint32x4_t* t, int k) {
  return vandq_u32(vshlq_u32(t[k / 4], vdupq_n_s32(-8 * (k % 4))), vdupq_n_u32(0xff));
}

// q4_k: weight = d * sc_j * q - dmin * m_j, q in [0, 16) (block j: low nibbles of qs[j / 2] for
// even j, high for odd); sc_j, m_j are the 6-bit fields of scales[12] (k4_scale_min).
struct NeonQ4_K {
  using Block = PackedQ4_K;
  static constexpr int kBlocksPer = 8;
  static constexpr bool kMin = true, kSub16 = false;
  static int8x16_t quants(const Block& p, int j, int g, int v) {
    const uint8x16_t x = vld1q_u8(p.qs[j / 2][g][4 * v]);
    return vreinterpretq_s8_u8(j % 2 ? vshrq_n_u8(x, 4) : vandq_u8(x, vdupq_n_u8(15)));
  }
  static void scales(const Block& p, NeonScales<8>* s) {
    const uint32x4_t m63 = vdupq_n_u32(63), m15 = vdupq_n_u32(15), m48 = vdupq_n_u32(0x30);
    for (int v = 0; v < 4; ++v) {
      const uint32x4_t dm = vld1q_u32(p.dm + 4 * v);  // d | dmin << 16
      const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(dm)));
      const float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vshrn_n_u32(dm, 16)));
      const uint32x4_t t[3] = {vld1q_u32(p.sc[0] + 4 * v), vld1q_u32(p.sc[1] + 4 * v),
                               vld1q_u32(p.sc[2] + 4 * v)};
      for (int j = 0; j < 8; ++j) {
        uint32x4_t sc, m;
        if (j < 4) {
          sc = vandq_u32(byte4(t, j), m63);
          m = vandq_u32(byte4(t, j + 4), m63);
        } else {
          const uint32x4_t hi4 = byte4(t, j + 4);
          sc = vorrq_u32(vandq_u32(hi4, m15), vandq_u32(vshrq_n_u32(byte4(t, j - 4), 2), m48));
          m = vorrq_u32(vshrq_n_u32(hi4, 4), vandq_u32(vshrq_n_u32(byte4(t, j), 2), m48));
        }
        s->scale[j][0][v] = s->scale[j][1][v] = vmulq_f32(d, vcvtq_f32_u32(sc));
        s->min[j][v] = vnegq_f32(vmulq_f32(dmin, vcvtq_f32_u32(m)));
      }
    }
  }
};

// q6_k: weight = d * scales[2j + e] * (u - 32) for half e of block j = 4hh + k, u = low nibble
// k / 2 of ql[hh][8 (k % 2) + g] | bits 2k .. 2k + 1 of qh[hh][g] << 4.
struct NeonQ6_K {
  using Block = PackedQ6_K;
  static constexpr int kBlocksPer = 8;
  static constexpr bool kMin = false, kSub16 = true;
  static int8x16_t quants(const Block& p, int j, int g, int v) {
    const int hh = j / 4, k = j % 4;
    const uint8x16_t ql = vld1q_u8(p.ql[hh][8 * (k % 2) + g][4 * v]);
    const uint8x16_t qh = vld1q_u8(p.qh[hh][g][4 * v]);
    const uint8x16_t low = vandq_u8(vshlq_u8(ql, vdupq_n_s8(static_cast<int8_t>(-4 * (k / 2)))),
                                    vdupq_n_u8(15));
    const uint8x16_t high = vshlq_n_u8(
        vandq_u8(vshlq_u8(qh, vdupq_n_s8(static_cast<int8_t>(-2 * k))), vdupq_n_u8(3)), 4);
    return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
  }
  static void scales(const Block& p, NeonScales<8>* s) {
    for (int v = 0; v < 4; ++v) {
      const float32x4_t d = half4(p.d, v);
      const uint32x4_t t[4] = {vld1q_u32(p.sc[0] + 4 * v), vld1q_u32(p.sc[1] + 4 * v),
                               vld1q_u32(p.sc[2] + 4 * v), vld1q_u32(p.sc[3] + 4 * v)};
      for (int j = 0; j < 8; ++j) {
        for (int e = 0; e < 2; ++e) {  // int8 scales[2j + e], sign-extended
          const int k = 2 * j + e;
          const int32x4_t s8 = vshlq_s32(
              vreinterpretq_s32_u32(vshlq_u32(t[k / 4], vdupq_n_s32(24 - 8 * (k % 4)))), vdupq_n_s32(-24));
          s->scale[j][e][v] = vmulq_f32(d, vcvtq_f32_s32(s8));
        }
        s->min[j][v] = vdupq_n_f32(0.0f);
      }
    }
  }
};

// dot[r][v] += group G of block j's columns 4v .. 4v + 3 times group G of row r (sdot's lane is
// a compile-time constant, hence the template).
template <typename N, int R, int G>
inline void group_dots(const typename N::Block& p, int j, const int8x16_t (&a)[R][2],
                       int32x4_t (&dot)[R][4]) {
  for (int v = 0; v < 4; ++v) {
    const int8x16_t w = N::quants(p, j, G, v);
    for (int r = 0; r < R; ++r) dot[r][v] = vdotq_laneq_s32(dot[r][v], w, a[r][G / 4], G % 4);
  }
}

// acc[r][v] += dot[r][v] * (scale[v] * d_a), then dot = 0.
template <int R>
inline void add_dots(const float32x4_t* scale, const BlockQ8A* const* x, int32x4_t (&dot)[R][4],
                     float32x4_t (&acc)[R][4]) {
  for (int v = 0; v < 4; ++v) {
    for (int r = 0; r < R; ++r) {
      acc[r][v] = vfmaq_f32(acc[r][v], vcvtq_f32_s32(dot[r][v]), vmulq_n_f32(scale[v], x[r]->d));
      dot[r][v] = vdupq_n_s32(0);
    }
  }
}

// y[R rows][nc of 16 columns] = act[R rows] · the group's blocks[n_blocks / kBlocksPer]: per
// 32-element block (per 16-element half where kSub16), int32 dots exact, then
// acc += dot * (scale_w * d_a) (+ min_w * s_a).
template <typename N, int R>
void tile(const typename N::Block* blocks, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes,
          float* y, int64_t ldy, int nc) {
  constexpr int kPer = N::kBlocksPer;
  const BlockQ8A* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.0f);
  }
  NeonScales<kPer> s;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const typename N::Block& p = blocks[b / kPer];
    const int j = static_cast<int>(b % kPer);
    if (j == 0) {
      const char* ahead = reinterpret_cast<const char*>(&p) + 2048;
      for (int64_t line = 0; line < int64_t(sizeof(p)); line += 64) __builtin_prefetch(ahead + line);
      N::scales(p, &s);
    }
    int8x16_t a[R][2];
    const BlockQ8A* x[R];
    for (int r = 0; r < R; ++r) {
      x[r] = &rows[r][b];
      a[r][0] = vld1q_s8(x[r]->qs);
      a[r][1] = vld1q_s8(x[r]->qs + 16);
    }
    int32x4_t dot[R][4];
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < 4; ++v) dot[r][v] = vdupq_n_s32(0);
    }
    [&]<int... G>(std::integer_sequence<int, G...>) { (group_dots<N, R, G>(p, j, a, dot), ...); }
    (std::make_integer_sequence<int, 4>{});
    if constexpr (N::kSub16) add_dots<R>(s.scale[j][0], x, dot, acc);  // elements 0 .. 15
    [&]<int... G>(std::integer_sequence<int, G...>) { (group_dots<N, R, G + 4>(p, j, a, dot), ...); }
    (std::make_integer_sequence<int, 4>{});
    add_dots<R>(s.scale[j][N::kSub16 ? 1 : 0], x, dot, acc);
    if constexpr (N::kMin) {
      for (int v = 0; v < 4; ++v) {
        for (int r = 0; r < R; ++r) acc[r][v] = vfmaq_n_f32(acc[r][v], s.min[j][v], x[r]->s);
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
    {DType::q4_0, gemm_packed<NeonQ4_0>}, {DType::q4_1, gemm_packed<NeonQ4_1>},
    {DType::q8_0, gemm_packed<NeonQ8_0>}, {DType::q4_k, gemm_packed<NeonQ4_K>},
    {DType::q6_k, gemm_packed<NeonQ6_K>},
};

}  // namespace

GemmFn gemm_kernel_neon(DType type) {
  for (const GemmEntry& e : kGemms) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

}  // namespace ember::cpu
