// cpu/x86/gemm_sources_avx2.h: what the AVX2 GEMM tiles read, one 32-element block of 8 columns
// at a time: the tiling constants and per-type traits, the block sources (packed panels, or the
// packed weight layout of weight_pack.h straight), and the panels packed from them. Included only
// by the AVX2 GEMM files (gemm_*avx2.cpp); internal linkage (see block_formats.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "cpu/x86/gemm_pack_x86.h"

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
  const int per = 32767 / (2 * F::kMaxU * 127);
  return per >= 8 ? 8 : per >= 4 ? 4 : per >= 2 ? 2 : 1;
}

// Unsigned one-scale types whose whole block sums in int16 (the 4-bit ones) take a block group
// by group across the rows (unsigned_block), which leaves registers for 6 rows. Against 4 rows
// row by row: pp GFLOP/s, 2048 x 2048, 1 thread, best of 25 (kernel_bench, Zen 4, three runs
// each way) q4_k 172-179 -> 205-214, q4_0 174-177 -> 217, q4_1 165-174 -> 212-216; decode (fewer
// than kMaxRows rows) lost to it (q4_0 tg 37 -> 29 GB/s), so it keeps the row-by-row order.
template <typename F>
constexpr bool kGroupOuter = !kSigned<F> && !F::kSub16 && groups_per_widen<F>() == 8;

// Rows per GEMM tile of the unsigned types (the signed ones: kWideRows).
template <typename F>
constexpr int kTileRows = kGroupOuter<F> ? 6 : kMaxRows;

// Packed signed types read the packed layout directly (as decode does) up to this many rows, in
// tiles of kDirectRows: the tiles then undo the bias and take |q| themselves, which costs less than
// widening a panel that serves few row tiles. kernel_bench 2048 x 5632 q8_0, 1 thread, Zen 4,
// alternating runs, ms direct / wide: 4 rows 0.76-0.97 / 1.44-1.51, 8 rows 1.46-1.92 / 2.06-2.10,
// 16 rows 3.05-3.81 / 3.43-3.74, 24 rows 4.59-5.02 / 4.91-4.95, 32 rows 6.08-7.64 / 6.10-6.15,
// 48 rows 9.0-11.3 / 8.5-8.6, 64 rows 11.8-11.9 / 10.7.
constexpr int64_t kDirectMaxRows = 32;
constexpr int kDirectRows = 8;  // signed_block keeps only R int32 sums and the group's q, |q| live

inline __m256i bcast_group(const BlockQ8A& a, int g) {
  int32_t v;
  std::memcpy(&v, a.qs + 4 * g, 4);
  return _mm256_set1_epi32(v);
}

// One 32-element block of 8 columns as tile_quant consumes it: the 8 u vectors (u[g]: lane c =
// column c's elements 4g .. 4g + 3; signed q where kSigned), |q| for signed types, and the
// panel's scale vectors.
struct Block8 {
  __m256i w[8];
  __m256 scale0, scale1, coef_s, coef_s_lo;
};

// A source hands tile_quant its blocks one at a time: prefetch(b), then load(b, x).

// Blocks from packed panels (the unsigned types' GEMM).
struct PanelSource {
  const Panel* panel;
  void prefetch(int64_t) const {}  // the panel is in L1
  void load(int64_t b, Block8* x) const {
    const Panel& p = panel[b];
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) x->w[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(p.u[g]));
    x->scale0 = _mm256_load_ps(p.scale[0]);
    x->scale1 = _mm256_load_ps(p.scale[1]);
    x->coef_s = _mm256_load_ps(p.coef_s);
    x->coef_s_lo = _mm256_load_ps(p.coef_s_lo);
  }
};

// Blocks straight from the packed weight layout (weight_pack.h): columns 8h .. 8h + 7 of a
// 16-column group, the same values pack_quant_panel stores from the file's rows (the scales by
// the same IEEE operations: scale = d, coef_s = min - kBias * scale).
template <typename F>
struct PackedSource;

template <typename Packed, typename F>
inline void packed_scales8(const Packed& p, int h, const uint16_t* m, Block8* x) {
  constexpr int kBias = kSigned<F> ? 0 : F::kBias;
  x->scale0 = x->scale1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.d + 8 * h)));
  const __m256 min = m ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 8 * h)))
                       : _mm256_setzero_ps();
  x->coef_s = _mm256_sub_ps(min, _mm256_mul_ps(_mm256_set1_ps(float(kBias)), x->scale0));
  x->coef_s_lo = _mm256_setzero_ps();
}

// The first pass over a group (h = 0) streams it from memory and asks for it ahead; the second
// half's pass finds the group in L2.
template <typename Packed>
inline void packed_prefetch(const Packed* block, int h) {
  if (h == 0) prefetch_packed(block);
}

template <typename Packed>
inline void packed_nibbles8(const Packed& p, int h, Block8* x) {
  const __m256i mask = _mm256_set1_epi8(15);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.qs[k][8 * h]));
    x->w[k] = _mm256_and_si256(v, mask);
    x->w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  }
}

template <>
struct PackedSource<FormatQ4_0> {
  const PackedQ4_0* blocks;  // the group's [n_blocks]
  int h;                     // which 8 of its 16 columns
  void prefetch(int64_t b) const { packed_prefetch(blocks + b, h); }
  void load(int64_t b, Block8* x) const {
    packed_nibbles8(blocks[b], h, x);
    packed_scales8<PackedQ4_0, FormatQ4_0>(blocks[b], h, nullptr, x);
  }
};

template <>
struct PackedSource<FormatQ4_1> {
  const PackedQ4_1* blocks;
  int h;
  void prefetch(int64_t b) const { packed_prefetch(blocks + b, h); }
  void load(int64_t b, Block8* x) const {
    packed_nibbles8(blocks[b], h, x);
    packed_scales8<PackedQ4_1, FormatQ4_1>(blocks[b], h, blocks[b].m, x);
  }
};

template <>
struct PackedSource<FormatQ8_0> {
  const PackedQ8_0* blocks;
  int h;
  void prefetch(int64_t b) const { packed_prefetch(blocks + b, h); }
  void load(int64_t b, Block8* x) const {
    static_assert(kSigned<FormatQ8_0>);  // the panel holds q = u - 128
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      x->w[g] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[b].u[g][8 * h])),
                                 _mm256_set1_epi8(-128));
    }
    packed_scales8<PackedQ8_0, FormatQ8_0>(blocks[b], h, nullptr, x);
  }
};

// K-quants (q4_k, q6_k) take ActFormat::q8a_k rows: the 8 blocks of a super-block share the
// activation scale d_a, so each block's integer dot per scale (32 or 16 elements) times the
// integer 6-bit / 8-bit scale sums exactly in int32 over the super-block, which then takes one
// float step; the mins (q4_k) and the bias (q6_k: u = q + 32) go through the blocks' sums s and
// s_lo as for the one-scale types:
//   Σ = d_w d_a Σ_j Σ_h sc_jh Σ_{i in half h} u_i q_i + Σ_j (coef_s_j s_j + coef_s_lo_j s_lo_j).
// Against a float scale step per block (as the one-scale types take), kernel_bench, one thread
// pinned, CPU time, best of 6 alternating runs, Zen 4: decode 1024 x 1024 (from L2) q4_k 25.7 ->
// 28.9, q6_k 19.9 -> 24.1 GB/s; pp 2048 x 2048 q4_k 214 -> 208, q6_k 139 -> 156 GFLOP/s.
template <typename F>
constexpr bool kSuperK = std::is_same_v<F, FormatQ4_K> || std::is_same_v<F, FormatQ6_K>;

// The scales of one super-block of 8 columns.
struct SuperK8 {
  __m256i sc[8][2];                // block j's half h: its integer scale in both int16 halves of the column's
                                   // lane, the madd operand (without kSub16 only sc[j][0])
  __m256 coef_s[8], coef_s_lo[8];  // coef_s_lo: kSub16 only
  __m256 d;                        // d_w
};

// 8 f16 values held in the low 16 bits of 8 dwords, as f32.
inline __m256 half_lo8(__m256i v) {
  const __m256i low = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}
inline __m256i load8_u32(const uint32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Byte k of each dword of v into both of its 16-bit halves: at bit 0 (kHigh false, zero above) or
// at bit 8 (kHigh, zero below).
template <int k, bool kHigh>
inline __m256i byte_pairs(__m256i v) {
  constexpr char z = -128;  // pshufb: zero
  constexpr char b0 = kHigh ? z : k, b1 = kHigh ? k : z;
  const __m256i ctrl = _mm256_setr_epi8(b0, b1, b0, b1, b0 + 4, b1 + 4, b0 + 4, b1 + 4,  //
                                        b0 + 8, b1 + 8, b0 + 8, b1 + 8, b0 + 12, b1 + 12, b0 + 12, b1 + 12,
                                        b0, b1, b0, b1, b0 + 4, b1 + 4, b0 + 4, b1 + 4,  //
                                        b0 + 8, b1 + 8, b0 + 8, b1 + 8, b0 + 12, b1 + 12, b0 + 12, b1 + 12);
  return _mm256_shuffle_epi8(v, ctrl);
}
// Column c's 12 scale bytes are the dwords t0, t1, t2 (k4_scale_min's table, vectorized): sc as
// madd pairs, coef_s = min = -(dmin * m) (kBias 0).
inline void decode_q4_k_scales(const PackedQ4_K& p, int h, SuperK8* s) {
  const __m256i ddmin = load8_u32(p.dm + 8 * h);
  const __m256 dmin = half_lo8(_mm256_srli_epi32(ddmin, 16));
  s->d = half_lo8(ddmin);
  const __m256i t0 = load8_u32(p.sc[0] + 8 * h), t1 = load8_u32(p.sc[1] + 8 * h),
                t2 = load8_u32(p.sc[2] + 8 * h);
  const __m256i t0k[4] = {byte_pairs<0, false>(t0), byte_pairs<1, false>(t0), byte_pairs<2, false>(t0),
                          byte_pairs<3, false>(t0)};
  const __m256i t2k[4] = {byte_pairs<0, false>(t2), byte_pairs<1, false>(t2), byte_pairs<2, false>(t2),
                          byte_pairs<3, false>(t2)};
  const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15), m48 = _mm256_set1_epi32(0x30);
  const __m256i p63 = _mm256_set1_epi16(63), p15 = _mm256_set1_epi16(15), p48 = _mm256_set1_epi16(0x30);
  __m256i m[8];
  for (int k = 0; k < 4; ++k) {
    // block k: sc = byte k of t0, m = byte k of t1 (6 bits each)
    s->sc[k][0] = _mm256_and_si256(t0k[k], p63);
    m[k] = _mm256_and_si256(_mm256_srli_epi32(t1, 8 * k), m63);
    // block k + 4: the low 4 bits from byte k of t2 (sc: its low nibble, m: its high one), the top
    // 2 from bits 6-7 of byte k of t0 (sc) and of t1 (m)
    s->sc[k + 4][0] = _mm256_or_si256(_mm256_and_si256(t2k[k], p15),
                                      _mm256_and_si256(_mm256_srli_epi16(t0k[k], 2), p48));
    m[k + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(t2, 8 * k + 4), m15),
                               _mm256_and_si256(_mm256_srli_epi32(t1, 8 * k + 2), m48));
  }
  for (int j = 0; j < 8; ++j) {
    s->coef_s[j] = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m[j])), _mm256_set1_ps(-0.0f));
  }
}

// Column c's 16 int8 scales are the dwords sc[0..3]; scale 2j + h is block j's half h, and the
// bias term of half h is -kBias * (d * scale) (pack_quant_panel's corrections).
inline void decode_q6_k_scales(const PackedQ6_K& p, int h, SuperK8* s) {
  s->d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.d + 8 * h)));
  for (int q = 0; q < 4; ++q) {  // scale 4q + k: byte k of sc[q], sign-extended into both int16 halves
    const __m256i v = load8_u32(p.sc[q] + 8 * h);
    const __m256i at8[4] = {byte_pairs<0, true>(v), byte_pairs<1, true>(v), byte_pairs<2, true>(v),
                            byte_pairs<3, true>(v)};
    for (int k = 0; k < 4; ++k) s->sc[2 * q + k / 2][k % 2] = _mm256_srai_epi16(at8[k], 8);
  }
  const __m256 bias = _mm256_set1_ps(float(FormatQ6_K::kBias));
  for (int j = 0; j < 8; ++j) {
    __m256 corr[2];
    for (int hh = 0; hh < 2; ++hh) {
      const __m256 scale = _mm256_mul_ps(s->d, _mm256_cvtepi32_ps(_mm256_srai_epi32(s->sc[j][hh], 16)));
      corr[hh] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(bias, scale));
    }
    // corr0 * s_lo + corr1 * (s - s_lo) = corr1 * s + (corr0 - corr1) * s_lo
    s->coef_s[j] = corr[1];
    s->coef_s_lo[j] = _mm256_sub_ps(corr[0], corr[1]);
  }
}

// A K-quant source hands tile_k one super-block at a time: prefetch(b0), scales(b0, scratch) (its
// SuperK8: decoded into scratch, or where the panel holds it), at(b0) (where its quants start),
// then quant(at, j, g) for its blocks j < 8 and groups g < 8 (u of elements 4g .. 4g + 3 of block
// b0 + j; j and g are constants once tile_k's loops are unrolled, so every load is at(b0) plus a
// constant: the fields and shifts depend on them).
template <>
struct PackedSource<FormatQ4_K> {
  const PackedQ4_K* blocks;  // the group's [n_blocks / 8] super-blocks
  int h;
  void prefetch(int64_t b0) const { packed_prefetch(blocks + b0 / 8, h); }
  const SuperK8& scales(int64_t b0, SuperK8* scratch) const {
    decode_q4_k_scales(blocks[b0 / 8], h, scratch);
    return *scratch;
  }
  // Super-block b0 / 8 from the column half's first quant byte (its quants are 4 bytes of each of
  // 16 columns, so the half's are 32 h bytes in).
  const uint8_t* at(int64_t b0) const {
    return reinterpret_cast<const uint8_t*>(blocks + b0 / 8) + offsetof(PackedQ4_K, qs) + 32 * h;
  }
  // Block j, group g: the low (j even) or high nibbles of qs[j / 2][g].
  static __m256i quant(const uint8_t* at, int j, int g) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64 * (8 * (j / 2) + g)));
    return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
  }
};

template <>
struct PackedSource<FormatQ6_K> {
  const PackedQ6_K* blocks;
  int h;
  void prefetch(int64_t b0) const { packed_prefetch(blocks + b0 / 8, h); }
  const SuperK8& scales(int64_t b0, SuperK8* scratch) const {
    decode_q6_k_scales(blocks[b0 / 8], h, scratch);
    return *scratch;
  }
  const uint8_t* at(int64_t b0) const {  // as PackedSource<FormatQ4_K>'s (ql is the first field)
    static_assert(offsetof(PackedQ6_K, ql) == 0);
    return reinterpret_cast<const uint8_t*>(blocks + b0 / 8) + 32 * h;
  }
  // Block j = 4hh + k, group g: low nibble k / 2 of ql[hh][8 (k % 2) + g], bits 2k .. 2k + 1 of
  // qh[hh][g] (moved to bits 4 .. 5 by one shift; no bit crosses a byte).
  static __m256i quant(const uint8_t* at, int j, int g) {
    const int hh = j / 4, k = j % 4;
    constexpr int kQh = offsetof(PackedQ6_K, qh);
    const __m256i ql = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(at + 64 * (16 * hh + 8 * (k % 2) + g)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + kQh + 64 * (8 * hh + g)));
    const __m256i low = _mm256_and_si256(k / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(15));
    const __m256i high_at4 = k < 2 ? _mm256_slli_epi16(qh, 4 - 2 * k) : _mm256_srli_epi16(qh, 2 * k - 4);
    return _mm256_or_si256(low, _mm256_and_si256(high_at4, _mm256_set1_epi8(0x30)));
  }
};

// The GEMM's K-quant panel: the u of every block, then the SuperK8 of every super-block.
struct PanelU {
  uint8_t u[8][kCols][4];
};
struct PanelSourceK {
  const PanelU* u;                 // [n_blocks]
  const SuperK8* supers;           // [n_blocks / 8]
  void prefetch(int64_t) const {}  // the panel is in L1 / L2
  const SuperK8& scales(int64_t b0, SuperK8*) const { return supers[b0 / 8]; }
  const uint8_t* at(int64_t b0) const { return u[b0].u[0][0]; }
  static __m256i quant(const uint8_t* at, int j, int g) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(at + sizeof(PanelU) * j + 32 * g));
  }
};

template <typename F>
using PackedBlock = decltype(*PackedSource<F>::blocks);

// Types whose avx2 kernels read the packed layout.
template <typename F>
constexpr bool kPacked = std::is_same_v<F, FormatQ4_0> || std::is_same_v<F, FormatQ4_1> ||
                         std::is_same_v<F, FormatQ8_0> || std::is_same_v<F, FormatQ4_K> ||
                         std::is_same_v<F, FormatQ6_K>;

// A panel from the packed layout: what PackedSource gives, stored.
template <typename F>
void pack_panel_from_packed(const PackedSource<F>& source, int64_t n_blocks, Panel* panel) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    Block8 x;
    source.load(b, &x);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(panel[b].u[g]), x.w[g]);
    _mm256_store_ps(panel[b].scale[0], x.scale0);
    _mm256_store_ps(panel[b].scale[1], x.scale1);
    _mm256_store_ps(panel[b].coef_s, x.coef_s);
    _mm256_store_ps(panel[b].coef_s_lo, x.coef_s_lo);
  }
}

// A K-quant panel (PanelSourceK's u[n_blocks], supers[n_blocks / 8]) from the packed layout.
template <typename F>
void pack_panel_k(const PackedSource<F>& source, int64_t n_blocks, PanelU* u, SuperK8* supers) {
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
    source.scales(b0, &supers[b0 / 8]);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(u[b0 + j].u[g]), source.quant(source.at(b0), j, g));
      }
    }
  }
}

// The panel of columns c0 .. c0 + nc of g (nc <= kCols).
template <typename F>
void pack_panel(const GemmArgs& g, int64_t c0, int nc, int64_t n_blocks, Panel* panel) {
  if constexpr (kPacked<F>) {
    using Block = std::remove_cvref_t<PackedBlock<F>>;
    const PackedSource<F> source{reinterpret_cast<const Block*>(g.w + c0 / 16 * 16 * g.w_row_bytes),
                                 static_cast<int>(c0 % 16 / 8)};
    pack_panel_from_packed<F>(source, n_blocks, panel);
  } else {
    pack_quant_panel<kCols, F, kSigned<F>>(g.w, g.w_row_bytes, c0, nc, n_blocks, panel);
  }
}

}  // namespace
}  // namespace ember::cpu
