// quant/quantize.cpp: reference quantizers of the types gguf-py writes (q4_0, q4_1, q5_0, q5_1,
// q8_0, tq1_0, tq2_0, mxfp4), bit for bit as gguf-py's gguf.quants.quantize: the same f32 operations in the
// same order, the same truncation and rounding, the same d == 0 handling, and the same float -> byte casts
// numpy performs on x86-64 (so even overflowing inputs give gguf-py's bytes).
#include <cmath>

#include "quant/blocks.h"
#include "quant/no_contract.h"
#include "quant/quant.h"

namespace ember {
namespace {

// numpy's float32 -> uint8 / int8 cast on x86-64: truncate to int32 (cvttss2si: NaN and values
// out of int32 range give INT32_MIN), then keep the low byte.
uint8_t numpy_cast_byte(float t) {
  const bool in_range = t >= -2147483648.0f && t < 2147483648.0f;  // false for NaN
  const int32_t i = in_range ? static_cast<int32_t>(t) : INT32_MIN;
  return static_cast<uint8_t>(static_cast<uint32_t>(i) & 0xffu);
}

// np.trunc(v).astype(np.uint8).clip(0, q_max)
uint8_t trunc_clip(float v, uint8_t q_max) {
  const uint8_t q = numpy_cast_byte(std::trunc(v));
  return q < q_max ? q : q_max;
}

// The signed value of largest magnitude, the first one on ties; numpy's argmax picks the first
// NaN if there is one.
float signed_absmax(const float* x) {
  int imax = 0;
  float amax = std::fabs(x[0]);
  for (int j = 1; j < kQK && !std::isnan(amax); ++j) {
    const float a = std::fabs(x[j]);
    if (a > amax || std::isnan(a)) {
      amax = a;
      imax = j;
    }
  }
  return x[imax];
}

// np.max / np.min of a block: NaN propagates (the first NaN is returned).
void block_min_max(const float* x, float* min, float* max) {
  *min = *max = x[0];
  for (int j = 0; j < kQK; ++j) {
    if (std::isnan(x[j])) {
      *min = *max = x[j];
      return;
    }
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// np.where(d == 0, 0, 1 / d)
float inverse_or_zero(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

// gguf-py's np_roundf: round half away from zero, as sign(v) * (floor(|v|) + floor(2 * frac)).
float np_roundf(float v) {
  const float a = std::fabs(v);
  const float floored = std::floor(a);
  const float b = floored + std::floor(2.0f * (a - floored));
  const float sign = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);  // np.sign: 0 and NaN map to themselves
  return sign * b;
}

// Packs 32 quants of up to 5 bits: low nibbles of q[j] and q[j + 16] share qs[j]; the fifth bits
// go to qh (element j at bit j), when qh is given.
void pack_nibbles(const uint8_t q[kQK], uint8_t qs[kQK / 2], uint8_t qh[4]) {
  for (int j = 0; j < kQK / 2; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | (q[j + kQK / 2] << 4));
  if (qh == nullptr) return;
  for (int i = 0; i < 4; ++i) {
    uint8_t byte = 0;
    for (int bit = 0; bit < 8; ++bit) byte |= static_cast<uint8_t>(((q[8 * i + bit] >> 4) & 1) << bit);
    qh[i] = byte;
  }
}

// A block's fifth bits qh, nullptr for the 4-bit types.
template <typename Block>
uint8_t* fifth_bits(Block& block) {
  if constexpr (requires { block.qh; }) {
    return block.qh;
  } else {
    return nullptr;
  }
}

// The one-scale types without a min (q4_0: kHalf 8, q5_0: 16): d = the value of largest
// magnitude / -kHalf (it maps to q = 0 exactly), q = trunc(x / d + kHalf + 0.5) in [0, 2 kHalf).
template <typename Block, int kHalf>
void quantize_row_symmetric(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    const float d = signed_absmax(src) / -static_cast<float>(kHalf);
    const float id = inverse_or_zero(d);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clip(src[j] * id + (kHalf + 0.5f), 2 * kHalf - 1);
    blocks[b].d = f32_to_f16(d);
    pack_nibbles(q, blocks[b].qs, fifth_bits(blocks[b]));
  }
}

// The types with a min (q4_1: kMax 15, q5_1: 31): d = (max - min) / kMax,
// q = trunc((x - min) / d + 0.5) in [0, kMax].
template <typename Block, int kMax>
void quantize_row_with_min(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<Block*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    float min, max;
    block_min_max(src, &min, &max);
    const float d = (max - min) / static_cast<float>(kMax);
    const float id = inverse_or_zero(d);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) q[j] = trunc_clip((src[j] - min) * id + 0.5f, kMax);
    blocks[b].d = f32_to_f16(d);
    blocks[b].m = f32_to_f16(min);
    pack_nibbles(q, blocks[b].qs, fifth_bits(blocks[b]));
  }
}

// The ternary types' trits of one super-block: t = round(x / d) + 1 in {0, 1, 2}, d = max |x|
// (returned), as gguf-py's TQ1_0 / TQ2_0.
float ternary_trits(const float* x, uint8_t t[kQK_K]) {
  float d = 0.0f;
  for (int j = 0; j < kQK_K; ++j) d = std::fmax(d, std::fabs(x[j]));
  const float id = inverse_or_zero(d);
  for (int j = 0; j < kQK_K; ++j) t[j] = static_cast<uint8_t>(numpy_cast_byte(np_roundf(x[j] * id)) + 1);
  return d;
}

// n trits as one tq1_0 byte: the base-3 number t[0] t[stride] ... (first trit most significant)
// as a fraction of 3^n scaled to 256, rounded up, so that trit k reads back as (q * 3^k) >> ...
uint8_t pack_trits(const uint8_t* t, int n, int stride) {
  uint32_t v = 0;
  for (int k = 0; k < n; ++k) v = 3 * v + t[k * stride];
  for (int k = n; k < 5; ++k) v *= 3;  // qh bytes hold 4 trits, weighted as the first 4 of 5
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}

}  // namespace

// src[n], n a multiple of 32; dst receives n / 32 blocks.

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  quantize_row_symmetric<BlockQ4_0, 8>(src, dst, n);
}
void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  quantize_row_with_min<BlockQ4_1, 15>(src, dst, n);
}
void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  quantize_row_symmetric<BlockQ5_0, 16>(src, dst, n);
}
void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  quantize_row_with_min<BlockQ5_1, 31>(src, dst, n);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    float amax = 0.0f;  // np.max of |x|, NaN propagating
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(src[j]);
      if (a > amax || std::isnan(a)) amax = a;
      if (std::isnan(a)) break;
    }
    const float d = amax / 127.0f;
    const float id = inverse_or_zero(d);
    blocks[b].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j)
      blocks[b].qs[j] = static_cast<int8_t>(numpy_cast_byte(np_roundf(src[j] * id)));
  }
}

void quantize_row_tq2_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockTQ2_0*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    uint8_t t[kQK_K];
    const float d = ternary_trits(src, t);
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        uint8_t q = 0;
        for (int k = 0; k < 4; ++k) q |= static_cast<uint8_t>(t[128 * h + 32 * k + l] << (2 * k));
        blocks[b].qs[32 * h + l] = q;
      }
    }
    blocks[b].d = f32_to_f16(d);
  }
}

void quantize_row_tq1_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockTQ1_0*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    uint8_t t[kQK_K];
    const float d = ternary_trits(src, t);
    for (int l = 0; l < 32; ++l) blocks[b].qs[l] = pack_trits(t + l, 5, 32);
    for (int l = 0; l < 16; ++l) blocks[b].qs[32 + l] = pack_trits(t + 160 + l, 5, 16);
    for (int l = 0; l < 4; ++l) blocks[b].qh[l] = pack_trits(t + 240 + l, 4, 4);
    blocks[b].d = f32_to_f16(d);
  }
}

// e = floor(log2(max |x|)) - 2 + 127 (the largest code, 6 = 12 / 2, then reaches max |x|), each
// value the nearest of the 16 codes times 2^(e - 128) (the first on ties), as gguf-py's MXFP4.
void quantize_row_mxfp4(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockMXFP4*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const uint8_t e = amax > 0.0f ? numpy_cast_byte(std::floor(std::log2(amax)) - 2.0f + 127.0f) : 0;
    const float d = e8m0_to_f32_half(e);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j) {
      int best = 0;
      float best_err = std::fabs(d * static_cast<float>(kMxfp4Values[0]) - src[j]);
      for (int c = 1; c < 16; ++c) {
        const float err = std::fabs(d * static_cast<float>(kMxfp4Values[c]) - src[j]);
        if (err < best_err) {
          best_err = err;
          best = c;
        }
      }
      q[j] = static_cast<uint8_t>(best);
    }
    blocks[b].e = e;
    pack_nibbles(q, blocks[b].qs, nullptr);
  }
}

}  // namespace ember
