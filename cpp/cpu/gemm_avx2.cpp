// cpu/gemm_avx2.cpp: prefill GEMM on AVX2. Same panel scheme as gemm_avx512.cpp with 8 columns
// per panel and R <= 4 rows per tile (16 ymm registers). Products go through maddubs (u8 x s8 ->
// s16 pairs); as long as the s16 partial sums cannot saturate, several 4-element groups are added
// in 16 bits before one madd widens them to 32, which saves most of the widening work for the
// 2-5 bit types. The 4-bit one-scale types sum a whole block in 16 bits and take it group by
// group across R <= 6 rows (kGroupOuter). The packed K-quants (q4_k, q6_k) sum a whole
// super-block in int32 with their integer scales against activations that share one scale per
// super-block (tile_k). Signed types (q8_0, iq4_nl) widen every group (signed_block) where they
// read the packed layout without a panel (decode, and packed q8_0 up to kDirectMaxRows rows); their
// GEMM multiplies int16 pairs of weights and activations instead (gemm_wide).
#include <algorithm>
#include <cstddef>
#include <type_traits>

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

// Signed types, one block b of 8 columns (p.w[g]: q of group g) for R rows: acc[r] gains the
// block's dot times scale0 * d. Group-outer, so that beside the R int32 sums only the group's q
// and |q| are live: the sums never spill. A maddubs lane |q| |a| + |q| |a| reaches 2 * 128 * 127,
// so every group widens at once; the integer sums are exact, so their order leaves the bits
// alone, and the float operations are the unsigned types' (one fmadd of the converted dot by
// scale0 * d per block).
template <int R>
inline void signed_block(const Block8& p, const BlockQ8A* const* rows, int64_t b, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[R];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    const __m256i abs_w = _mm256_sign_epi8(p.w[g], p.w[g]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i a = _mm256_sign_epi8(bcast_group(rows[r][b], g), p.w[g]);
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, a), ones);
      sum[r] = g == 0 ? dot : _mm256_add_epi32(sum[r], dot);
      // Keeps each row's sum one chain: GCC would otherwise reassociate it into a tree that
      // holds all 8 groups' dots of every row at once, and spill.
      asm("" : "+x"(sum[r]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 dot = _mm256_cvtepi32_ps(sum[r]);
    acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(rows[r][b].d)), acc[r]);
  }
}

// Unsigned types, one block b of 8 columns (p: u and scales) for R rows: acc[r] gains the block's
// dot product with row r.
template <int R, typename F>
inline void unsigned_block(const Block8& p, const BlockQ8A* const* rows, int64_t b, __m256* acc) {
  static_assert(!kSigned<F>);
  constexpr int kGroups = groups_per_widen<F>();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i* w = p.w;
  if constexpr (kGroupOuter<F> && R >= kMaxRows) {  // the GEMM's tiles; decode keeps the row-outer order
    // Group-outer: one weight vector at a time against every row, so that beside the R int16
    // sums and R accumulators only it and a broadcast are live (the row-outer order keeps all 8).
    __m256i sum16[R];
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i prod = _mm256_maddubs_epi16(w[g], bcast_group(rows[r][b], g));
        sum16[r] = g == 0 ? prod : _mm256_add_epi16(sum16[r], prod);
        asm("" : "+x"(sum16[r]));  // one chain a row, as in signed_block
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const BlockQ8A& a = rows[r][b];
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[r], ones));
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(a.d)), acc[r]);
      acc[r] = _mm256_fmadd_ps(p.coef_s, _mm256_set1_ps(a.s), acc[r]);
    }
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const BlockQ8A& a = rows[r][b];
    // half[e]: Σ u a over elements 16e .. 16e + 15 where the halves have their own
    // scales (kSub16), else half[0] over all 32 (up to 8 groups summed in int16).
    constexpr int kParts = F::kSub16 ? 2 : 1, kPer = 8 / kParts;
    __m256i half[kParts];
#pragma GCC unroll 8
    for (int e = 0; e < kParts; ++e) {
      __m256i sum32 = _mm256_setzero_si256(), sum16 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = kPer * e; g < kPer * e + kPer; ++g) {
        const __m256i av = bcast_group(a, g);
        const __m256i prod = _mm256_maddubs_epi16(w[g], av);
        const int i = g - kPer * e;  // the group's place in its part
        sum16 = i % kGroups == 0 ? prod : _mm256_add_epi16(sum16, prod);
        if (i % kGroups == kGroups - 1 || i == kPer - 1) {
          sum32 = _mm256_add_epi32(sum32, _mm256_madd_epi16(sum16, ones));
        }
      }
      half[e] = sum32;
    }
    __m256& out = acc[r];
    if constexpr (F::kSub16) {
      __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(half[0]), p.scale0);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half[1]), p.scale1, t);
      out = _mm256_fmadd_ps(t, _mm256_set1_ps(a.d), out);
      out = _mm256_fmadd_ps(p.coef_s_lo, _mm256_set1_ps(a.s_lo), out);
    } else {
      const __m256 dot = _mm256_cvtepi32_ps(half[0]);
      out = _mm256_fmadd_ps(dot, _mm256_mul_ps(p.scale0, _mm256_set1_ps(a.d)), out);
    }
    out = _mm256_fmadd_ps(p.coef_s, _mm256_set1_ps(a.s), out);
  }
}

// rows[R]: the activation rows of a tile, act_row_bytes apart.
template <int R>
inline void tile_rows(const uint8_t* act, int64_t act_row_bytes, const BlockQ8A** rows) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8A*>(act + r * act_row_bytes);
}

// The first nc[h] columns of half h's accumulators of each row into y (row stride ldy).
template <int R, int kHalves>
inline void store_tile(const __m256 (*acc)[R], float* y, int64_t ldy, const int* nc) {
  alignas(32) float out[kCols];
#pragma GCC unroll 2
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(out, acc[h][r]);
      std::memcpy(y + r * ldy + kCols * h, out, sizeof(float) * nc[h]);
    }
  }
}

// y[R][8 kHalves] = R activation rows · the columns sources[0..kHalves) give (8 each: the
// halves of one 16-column group in decode, so its bytes stream once with two independent
// accumulator chains); only the first nc[h] columns of half h are stored. Every column gets
// the same operations in the same order whatever R, kHalves or the source.
template <int R, int kHalves, typename F, typename Source>
void tile_quant(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
                int64_t ldy, const int* nc) {
  __m256 acc[kHalves][R];
#pragma GCC unroll 8
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
  }
  const BlockQ8A* rows[R];
  tile_rows<R>(act, act_row_bytes, rows);
  for (int64_t b = 0; b < n_blocks; ++b) {
    sources[0].prefetch(b);
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      Block8 p;
      sources[h].load(b, &p);
      if constexpr (kSigned<F>) {
        signed_block<R>(p, rows, b, acc[h]);
      } else {
        unsigned_block<R, F>(p, rows, b, acc[h]);
      }
    }
  }
  store_tile<R, kHalves>(acc, y, ldy, nc);
}

// K-quants, block j of the super-block at b0, for R rows and the kHalves column halves of the
// sources: isum[h][r] gains Σ_e sc_e Σ_{i in half e} u_i q_i (e: the block's scale halves;
// s[h]->sc[j]) of row r, exactly. Group by group across halves and rows, so that beside the sums
// only one group's u per half and one broadcast are live. In the GEMM's tiles each row's int16
// sum stays one chain (as in signed_block).
template <int R, int kHalves, typename F, typename Source>
inline void k_block(const uint8_t* const* at, const SuperK8* const* s, const BlockQ8A* const* rows,
                    int64_t b0, int j, __m256i (*isum)[R]) {
  constexpr int kGroups = groups_per_widen<F>();
  constexpr int kPer = F::kSub16 ? 4 : 8;  // groups per scale
  __m256i sum16[kHalves][R];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    __m256i w[kHalves];
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) w[h] = Source::quant(at[h], j, g);
    const int i = g % kPer;  // the group's place in its scale's half
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i a = bcast_group(rows[r][b0 + j], g);
#pragma GCC unroll 2
      for (int h = 0; h < kHalves; ++h) {
        const __m256i prod = _mm256_maddubs_epi16(w[h], a);
        sum16[h][r] = i % kGroups == 0 ? prod : _mm256_add_epi16(sum16[h][r], prod);
        if constexpr (R >= kMaxRows) asm("" : "+x"(sum16[h][r]));
      }
    }
    if (i % kGroups == kGroups - 1 || i == kPer - 1) {
#pragma GCC unroll 2
      for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          isum[h][r] = _mm256_add_epi32(isum[h][r], _mm256_madd_epi16(sum16[h][r], s[h]->sc[j][g / kPer]));
          // One chain too: GCC would otherwise reassociate the integer sum of the super-block's
          // 8-32 terms into a tree at its end and keep every term in memory until then.
          asm("" : "+x"(isum[h][r]));
        }
      }
    }
  }
}

// tile_quant for the K-quants: per super-block, the integer sums of its 8 blocks, then per row
// the blocks' coef terms and the one float step d_w d_a Σ, in that order whatever R, kHalves or
// the source.
template <int R, int kHalves, typename F, typename Source>
void tile_k(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
            int64_t ldy, const int* nc) {
  __m256 acc[kHalves][R];
#pragma GCC unroll 8
  for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
  }
  const BlockQ8A* rows[R];
  tile_rows<R>(act, act_row_bytes, rows);
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
    sources[0].prefetch(b0);
    SuperK8 scratch[kHalves];
    const SuperK8* s[kHalves];
    const uint8_t* at[kHalves];
    __m256i isum[kHalves][R];
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      s[h] = &sources[h].scales(b0, &scratch[h]);
      at[h] = sources[h].at(b0);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[h][r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) k_block<R, kHalves, F, Source>(at, s, rows, b0, j, isum);
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const BlockQ8A* a = rows[r] + b0;
        __m256 t = acc[h][r];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          t = _mm256_fmadd_ps(s[h]->coef_s[j], _mm256_set1_ps(a[j].s), t);
          if constexpr (F::kSub16) t = _mm256_fmadd_ps(s[h]->coef_s_lo[j], _mm256_set1_ps(a[j].s_lo), t);
        }
        const __m256 scale = _mm256_mul_ps(s[h]->d, _mm256_set1_ps(a[0].d));
        acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][r]), scale, t);
      }
    }
  }
  store_tile<R, kHalves>(acc, y, ldy, nc);
}

// The tile of a type: tile_k for the K-quants, tile_quant for the rest.
template <int R, int kHalves, typename F, typename Source>
void tile(const Source* sources, int64_t n_blocks, const uint8_t* act, int64_t act_row_bytes, float* y,
          int64_t ldy, const int* nc) {
  if constexpr (kSuperK<F>) {
    tile_k<R, kHalves, F>(sources, n_blocks, act, act_row_bytes, y, ldy, nc);
  } else {
    tile_quant<R, kHalves, F>(sources, n_blocks, act, act_row_bytes, y, ldy, nc);
  }
}

// fn.template operator()<R>() with R = n_rows, 1 <= n_rows <= kMax: a tile's row count as the
// template argument its tile_quant needs.
template <int kMax, int R = 1, typename Fn>
inline void with_rows(int n_rows, Fn&& fn) {
  if constexpr (R < kMax) {
    if (n_rows > R) return with_rows<kMax, R + 1>(n_rows, fn);
  }
  fn.template operator()<R>();
}

// Decode (1 .. kMaxRows - 1 rows) straight from the packed layout, columns [c0, c_end): whole
// 16-column groups in one pass each, a lone half (a range edge inside a group) alone.
template <int R, typename F>
void decode_packed(const GemmArgs& g, int64_t c0, int64_t c_end) {
  using Block = std::remove_cvref_t<PackedBlock<F>>;
  const int64_t n_blocks = g.n_in / 32;
  while (c0 < c_end) {
    const auto* blocks = reinterpret_cast<const Block*>(g.w + c0 / 16 * 16 * g.w_row_bytes);
    const int h = static_cast<int>(c0 % 16 / 8);
    const int nc[2] = {static_cast<int>(std::min<int64_t>(kCols, c_end - c0)),
                       static_cast<int>(std::clamp<int64_t>(c_end - c0 - kCols, 0, kCols))};
    if (h == 0 && nc[1] > 0) {  // the group's zero columns past n_out make the second half safe to read
      const PackedSource<F> sources[2] = {{blocks, 0}, {blocks, 1}};
      tile<R, 2, F>(sources, n_blocks, g.act, g.act_row_bytes, g.y + c0, g.ldy, nc);
      c0 += 2 * kCols;
    } else {
      const PackedSource<F> source{blocks, h};
      tile<R, 1, F>(&source, n_blocks, g.act, g.act_row_bytes, g.y + c0, g.ldy, nc);
      c0 += kCols;
    }
  }
}

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

// Decode-shaped calls (fewer than kMaxRows rows) of packed types: straight from the packed layout.
template <typename F>
void decode_rows(const GemmArgs& g) {
  switch (g.n_rows) {
    case 1: decode_packed<1, F>(g, g.col_begin, g.col_end); break;
    case 2: decode_packed<2, F>(g, g.col_begin, g.col_end); break;
    default: decode_packed<3, F>(g, g.col_begin, g.col_end); break;
  }
}

// Every row of g over the panel `panels` of columns c0 .. c0 + nc[0], in tiles of up to
// kTileRows<F> rows.
template <typename F, typename Source>
void panel_row_tiles(const GemmArgs& g, const Source& panels, int64_t n_blocks, int64_t c0, const int* nc) {
  constexpr int kRows = kTileRows<F>;
  for (int64_t r0 = 0; r0 < g.n_rows; r0 += kRows) {
    const uint8_t* act = g.act + r0 * g.act_row_bytes;
    float* y = g.y + r0 * g.ldy + c0;
    with_rows<kRows>(static_cast<int>(std::min<int64_t>(kRows, g.n_rows - r0)),
                     [&]<int R>() { tile<R, 1, F>(&panels, n_blocks, act, g.act_row_bytes, y, g.ldy, nc); });
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

// Packed types: below kMaxRows rows (packed signed types: up to kDirectMaxRows) the tiles read
// the packed layout directly (decode: the weights stream once, no panel), from there on through a
// panel packed from it (signed types: gemm_wide). All run the same integer dots and the same float
// operations on the same values, so a row's result never depends on the row count.
template <typename F>
void gemm_quant(const GemmArgs& g) {
  if constexpr (kPacked<F>) {
    if (g.n_rows < kMaxRows) return decode_rows<F>(g);
    if constexpr (kSigned<F>) {
      if (g.n_rows <= kDirectMaxRows) return direct_packed<F>(g);
    }
  }
  if constexpr (kSigned<F>) {
    return gemm_wide<F>(g);
  } else {
    const int64_t n_blocks = g.n_in / 32;
    auto* panel = static_cast<Panel*>(g.panel);
    for (int64_t c0 = g.col_begin; c0 < g.col_end; c0 += kCols) {
      const int nc[1] = {static_cast<int>(std::min<int64_t>(kCols, g.col_end - c0))};
      pack_panel<F>(g, c0, nc[0], n_blocks, panel);
      panel_row_tiles<F>(g, PanelSource{panel}, n_blocks, c0, nc);
    }
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
    {DType::q3_k, gemm_quant<FormatQ3_K>},     {DType::q4_k, gemm_k<FormatQ4_K>},
    {DType::q5_k, gemm_quant<FormatQ5_K>},     {DType::q6_k, gemm_k<FormatQ6_K>},
};

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
  for (const GemmEntry& e : kGemms) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

// Every GEMM-shaped call of a signed type gets the tiles, also packed q8_0's up to kDirectMaxRows
// rows, which read the BlockQ8A rows instead: one threshold serves both types, and the unused
// tiles cost q8_0 nothing measurable (kernel_bench 2048 x 5632, 1 thread, 4 / 8 / 16 rows:
// 0.752 / 1.498 / 3.064 ms without them, 0.763 / 1.495 / 3.071 with).
ActTiling act_tiling_avx2() { return {kWideRows, kMaxRows, 0, wide_act_bytes, pack_wide_act}; }

bool gemm_act_tiled_avx2(DType type) { return type == DType::q8_0 || type == DType::iq4_nl; }

int64_t panel_bytes_avx2(int64_t n_in) {
  static_assert(sizeof(PanelU) + sizeof(SuperK8) / 8 <= sizeof(Panel) + sizeof(WidePanelBlock));  // gemm_k's
  return std::max<int64_t>(static_cast<int64_t>(sizeof(Panel) + sizeof(WidePanelBlock)) * (n_in / 32),
                           static_cast<int64_t>(sizeof(float)) * kCols * n_in);
}

}  // namespace ember::cpu
