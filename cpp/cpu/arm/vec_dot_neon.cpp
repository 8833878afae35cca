// cpu/arm/vec_dot_neon.cpp: aarch64 NEON + dotprod dot products and the neon kernel table.
// sdot multiplies s8 x s8, so each block's u = q + kBias is turned back into the signed q before
// the dot product and no bias term is needed; only the formats' real mins remain.
// q4_0, q4_1, q8_0, q4_k and q6_k weights are packed at load and run gemm_neon.cpp's kernel for every row
// count; the other types loop over vec_dot for every shape.
#include <arm_neon.h>

#include "cpu/block_formats.h"
#include "cpu/gemm.h"
#include "cpu/matmul_kernels.h"

namespace ember::cpu {
namespace {

// Two 16-byte halves of one block: elements 0..15 and 16..31.
struct Halves {
  uint8x16_t lo, hi;
};

inline Halves nibbles(const uint8_t* p) {
  const uint8x16_t v = vld1q_u8(p);
  return {vandq_u8(v, vdupq_n_u8(15)), vshrq_n_u8(v, 4)};
}

// byte i of the result = 0xff if bit i (of 16 consecutive bits starting at bit 0) is set.
inline uint8x16_t bits16_to_bytes(uint32_t bits) {
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)),
                                       vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  const uint8x16_t mask = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vtstq_u8(bytes, mask);
}

inline Halves quants_neon(FormatQ4_0, const void* row, int64_t b) {
  return nibbles(static_cast<const BlockQ4_0*>(row)[b].qs);
}
inline Halves quants_neon(FormatQ4_1, const void* row, int64_t b) {
  return nibbles(static_cast<const BlockQ4_1*>(row)[b].qs);
}

template <typename Block>
inline Halves q5_quants(const Block& x) {
  const uint32_t qh = load_u32(x.qh);
  Halves h = nibbles(x.qs);
  h.lo = vorrq_u8(h.lo, vandq_u8(bits16_to_bytes(qh), vdupq_n_u8(16)));
  h.hi = vorrq_u8(h.hi, vandq_u8(bits16_to_bytes(qh >> 16), vdupq_n_u8(16)));
  return h;
}
inline Halves quants_neon(FormatQ5_0, const void* row, int64_t b) {
  return q5_quants(static_cast<const BlockQ5_0*>(row)[b]);
}
inline Halves quants_neon(FormatQ5_1, const void* row, int64_t b) {
  return q5_quants(static_cast<const BlockQ5_1*>(row)[b]);
}

inline Halves quants_neon(FormatQ8_0, const void* row, int64_t b) {
  const auto* qs = reinterpret_cast<const uint8_t*>(static_cast<const BlockQ8_0*>(row)[b].qs);
  const uint8x16_t flip = vdupq_n_u8(128);
  return {veorq_u8(vld1q_u8(qs), flip), veorq_u8(vld1q_u8(qs + 16), flip)};
}

inline Halves quants_neon(FormatIQ4_NL, const void* row, int64_t b) {
  const uint8x16_t table = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
  Halves h = nibbles(static_cast<const BlockIQ4_NL*>(row)[b].qs);
  return {vqtbl1q_u8(table, h.lo), vqtbl1q_u8(table, h.hi)};
}

// Shift right by a run-time count (vshlq with a negative count shifts right).
inline uint8x16_t shr(uint8x16_t v, int n) { return vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(-n))); }

inline Halves quants_neon(FormatQ2_K, const void* row, int64_t b) {
  const BlockQ2_K& x = static_cast<const BlockQ2_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* qs = x.qs + 32 * (j / 4);
  const uint8x16_t m = vdupq_n_u8(3);
  return {vandq_u8(shr(vld1q_u8(qs), 2 * (j % 4)), m), vandq_u8(shr(vld1q_u8(qs + 16), 2 * (j % 4)), m)};
}

inline Halves quants_neon(FormatQ3_K, const void* row, int64_t b) {
  const BlockQ3_K& x = static_cast<const BlockQ3_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* qs = x.qs + 32 * (j / 4);
  const uint8x16_t m = vdupq_n_u8(3), bit = vdupq_n_u8(static_cast<uint8_t>(1 << j)), four = vdupq_n_u8(4);
  const uint8x16_t lo = vandq_u8(shr(vld1q_u8(qs), 2 * (j % 4)), m);
  const uint8x16_t hi = vandq_u8(shr(vld1q_u8(qs + 16), 2 * (j % 4)), m);
  return {vorrq_u8(lo, vandq_u8(vtstq_u8(vld1q_u8(x.hmask), bit), four)),
          vorrq_u8(hi, vandq_u8(vtstq_u8(vld1q_u8(x.hmask + 16), bit), four))};
}

template <typename Block>
inline Halves k4_quants(const Block& x, int j) {
  const uint8_t* qs = x.qs + 32 * (j / 2);
  const uint8x16_t m = vdupq_n_u8(15);
  return {vandq_u8(shr(vld1q_u8(qs), 4 * (j % 2)), m), vandq_u8(shr(vld1q_u8(qs + 16), 4 * (j % 2)), m)};
}

inline Halves quants_neon(FormatQ4_K, const void* row, int64_t b) {
  return k4_quants(static_cast<const BlockQ4_K*>(row)[b / 8], static_cast<int>(b % 8));
}

inline Halves quants_neon(FormatQ5_K, const void* row, int64_t b) {
  const BlockQ5_K& x = static_cast<const BlockQ5_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  Halves h = k4_quants(x, j);
  const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1 << j)), sixteen = vdupq_n_u8(16);
  h.lo = vorrq_u8(h.lo, vandq_u8(vtstq_u8(vld1q_u8(x.qh), bit), sixteen));
  h.hi = vorrq_u8(h.hi, vandq_u8(vtstq_u8(vld1q_u8(x.qh + 16), bit), sixteen));
  return h;
}

inline Halves quants_neon(FormatQ6_K, const void* row, int64_t b) {
  const BlockQ6_K& x = static_cast<const BlockQ6_K*>(row)[b / 8];
  const int j = static_cast<int>(b % 8), h = j / 4, k = j % 4;
  const uint8_t* ql = x.ql + 64 * h + 32 * (k % 2);
  const uint8_t* qh = x.qh + 32 * h;
  const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(0x30);
  auto one = [&](int o) {
    const uint8x16_t low = vandq_u8(shr(vld1q_u8(ql + o), 4 * (k / 2)), m4);
    const uint8x16_t high = vandq_u8(vshlq_n_u8(shr(vld1q_u8(qh + o), 2 * k), 4), m2);
    return vorrq_u8(low, high);
  };
  return {one(0), one(16)};
}

inline Halves quants_neon(FormatMXFP4, const void* row, int64_t b) {
  const uint8x16_t table = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};  // codebook + 12
  Halves h = nibbles(static_cast<const BlockMXFP4*>(row)[b].qs);
  return {vqtbl1q_u8(table, h.lo), vqtbl1q_u8(table, h.hi)};
}

inline Halves quants_neon(FormatTQ2_0, const void* row, int64_t b) {
  const BlockTQ2_0& x = static_cast<const BlockTQ2_0*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  const uint8_t* qs = x.qs + 32 * (j / 4);
  const uint8x16_t m = vdupq_n_u8(3);
  return {vandq_u8(shr(vld1q_u8(qs), 2 * (j % 4)), m), vandq_u8(shr(vld1q_u8(qs + 16), 2 * (j % 4)), m)};
}

// Trit i of byte v[i]: ((uint8_t)(v[i] * pow3[i]) * 3) >> 8.
inline uint8x16_t trits(uint8x16_t v, uint8x16_t pow3) {
  const uint8x16_t q = vmulq_u8(v, pow3);
  const uint8x8_t three = vdup_n_u8(3);
  return vcombine_u8(vshrn_n_u16(vmull_u8(vget_low_u8(q), three), 8),
                     vshrn_n_u16(vmull_u8(vget_high_u8(q), three), 8));
}

inline Halves quants_neon(FormatTQ1_0, const void* row, int64_t b) {
  const BlockTQ1_0& x = static_cast<const BlockTQ1_0*>(row)[b / 8];
  const int j = static_cast<int>(b % 8);
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  if (j < 5) {
    const uint8x16_t p = vdupq_n_u8(kPow3[j]);
    return {trits(vld1q_u8(x.qs), p), trits(vld1q_u8(x.qs + 16), p)};
  }
  const uint8x16_t tail = vld1q_u8(x.qs + 32);
  if (j < 7)
    return {trits(tail, vdupq_n_u8(kPow3[2 * (j - 5)])), trits(tail, vdupq_n_u8(kPow3[2 * (j - 5) + 1]))};
  // Upper half: byte 4n + l is qh[l], taken to trit n.
  const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(load_u32(x.qh)));
  const uint8x16_t pow3 = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
  return {trits(tail, vdupq_n_u8(kPow3[4])), trits(qh, pow3)};
}

// The formats without a vector twin (the i-quants' grid lookups): their scalar quants(), loaded.
template <typename F>
inline Halves quants_neon(F, const void* row, int64_t b) {
  uint8_t u[32];
  F::quants(row, b, u);
  return {vld1q_u8(u), vld1q_u8(u + 16)};
}

template <typename F>
float vec_dot_quant(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* act = static_cast<const BlockQ8A*>(act_row);
  const int8x16_t bias = vdupq_n_s8(static_cast<int8_t>(F::kBias));  // 128 wraps to -128: q = u ^ 0x80
  float32x4_t acc = vdupq_n_f32(0.0f);
  float acc_min = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const BlockQ8A& a = act[b];
    BlockScales s;
    F::scales(w_row, b, &s);
    const Halves u = quants_neon(F{}, w_row, b);
    const int8x16_t q_lo = vsubq_s8(vreinterpretq_s8_u8(u.lo), bias);
    const int8x16_t q_hi = vsubq_s8(vreinterpretq_s8_u8(u.hi), bias);
    const int32x4_t d_lo = vdotq_s32(vdupq_n_s32(0), q_lo, vld1q_s8(a.qs));
    const int32x4_t d_hi = vdotq_s32(vdupq_n_s32(0), q_hi, vld1q_s8(a.qs + 16));
    acc = vmlaq_n_f32(acc, vcvtq_f32_s32(d_lo), s.scale[0] * a.d);
    acc = vmlaq_n_f32(acc, vcvtq_f32_s32(d_hi), s.scale[1] * a.d);
    acc_min += s.min[0] * a.s_lo + s.min[1] * (a.s - a.s_lo);
  }
  return vaddvq_f32(acc) + acc_min;
}

template <typename Load>
float vec_dot_float(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* x = static_cast<const float*>(act_row);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n_in; i += 8) {
    acc0 = vfmaq_f32(acc0, Load::load4(w_row, i), vld1q_f32(x + i));
    acc1 = vfmaq_f32(acc1, Load::load4(w_row, i + 4), vld1q_f32(x + i + 4));
  }
  float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
  for (; i < n_in; ++i) sum += Load::load1(w_row, i) * x[i];
  return sum;
}

struct LoadF32 {
  static float32x4_t load4(const void* w, int64_t i) { return vld1q_f32(static_cast<const float*>(w) + i); }
  static float load1(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct LoadF16 {
  static float32x4_t load4(const void* w, int64_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(static_cast<const uint16_t*>(w) + i)));
  }
  static float load1(const void* w, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(w)[i]); }
};
struct LoadBF16 {
  static float32x4_t load4(const void* w, int64_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(static_cast<const uint16_t*>(w) + i), 16));
  }
  static float load1(const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); }
};

template <typename F>
constexpr TypeKernels quant_kernels() {
  return {ActFormat::q8a, vec_dot_quant<F>, nullptr, 1};
}

IsaKernels make_table() {
  IsaKernels t;
  t.level = IsaLevel::neon;
  t.quantize_act = quantize_act_row_ref;  // scalar: a small share of any matmul's time
  auto set = [&t](DType type, TypeKernels k) { t.types[static_cast<uint32_t>(type)] = k; };
  set(DType::f32, {ActFormat::f32, vec_dot_float<LoadF32>, nullptr, 1});
  set(DType::f16, {ActFormat::f32, vec_dot_float<LoadF16>, nullptr, 1});
  set(DType::bf16, {ActFormat::f32, vec_dot_float<LoadBF16>, nullptr, 1});
  for_each_block_format([&](DType type, auto format) { set(type, quant_kernels<decltype(format)>()); });
  for (DType type : {DType::q4_0, DType::q4_1, DType::q8_0, DType::q4_k, DType::q6_k}) {
    TypeKernels& k = t.types[static_cast<uint32_t>(type)];
    k.gemm = gemm_kernel_neon(type);
    k.gemm_cols = kPackCols;
    k.gemm_any_rows = true;  // one tile kernel for every row count
    k.pack = weight_packer(type);
  }
  return t;
}

}  // namespace

const IsaKernels& isa_kernels_neon() {
  static const IsaKernels table = make_table();
  return table;
}

}  // namespace ember::cpu
