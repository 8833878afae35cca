// quant/dequantize_k.cpp: reference dequantizers of the 256-element super-block types (q2_k ...
// q6_k, iq4_xs). Bit for bit as gguf-py: each sub-block's scale (and min) is first multiplied out
// in f32 (d * sc), then applied to the f32 quant with one rounded multiply (and one rounded
// subtract of dmin * m), never as a fused or reassociated expression.
//
// Each block is decoded in two steps: unpack the quants into q[256] (integers, layouts in
// blocks.h), then scale one sub-block at a time. Both steps are plain loops with uniform shifts,
// which the compiler vectorizes; the block is read from a local copy, since float stores to dst
// could otherwise alias the source bytes.
#include "quant/blocks.h"
#include "quant/no_contract.h"
#include "quant/quant.h"

namespace ember {
namespace {

// q[128h + 32k + l] = bits 2k..2k+1 of qs[32h + l]: the 2-bit fields of q2_k and q3_k.
void unpack_2bit(const uint8_t qs[kQK_K / 4], int8_t q[kQK_K]) {
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l)
        q[128 * h + 32 * k + l] = static_cast<int8_t>((qs[32 * h + l] >> (2 * k)) & 3);
    }
  }
}

// q[64j + 32h + l] = nibble h of qs[32j + l]: the 4-bit fields of q4_k and q5_k.
void unpack_4bit(const uint8_t qs[kQK_K / 2], int8_t q[kQK_K]) {
  for (int j = 0; j < 4; ++j) {
    for (int l = 0; l < 32; ++l) {
      q[64 * j + l] = static_cast<int8_t>(qs[32 * j + l] & 0x0f);
      q[64 * j + 32 + l] = static_cast<int8_t>(qs[32 * j + l] >> 4);
    }
  }
}

// The 6-bit scale and min of sub-block i < 8 of a q4_k / q5_k block (layout in blocks.h).
void k_scale_min(const uint8_t scales[kKScaleBytes], int i, int* sc, int* m) {
  if (i < 4) {
    *sc = scales[i] & 63;
    *m = scales[i + 4] & 63;
  } else {
    *sc = (scales[i + 4] & 0x0f) | ((scales[i - 4] >> 2) & 0x30);
    *m = (scales[i + 4] >> 4) | ((scales[i] >> 2) & 0x30);
  }
}

// dst[32s + l] = (d * sc_s) * q[32s + l] - dmin * m_s for the 8 sub-blocks of q4_k / q5_k.
void scale_k_sub_blocks(const uint8_t scales[kKScaleBytes], float d, float dmin, const int8_t q[kQK_K],
                        float* dst) {
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    k_scale_min(scales, s, &sc, &m);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) dst[32 * s + l] = dl * static_cast<float>(q[32 * s + l]) - ml;
  }
}

}  // namespace

// src holds n / 256 blocks (2-byte aligned); dst[n].

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ2_K x = blocks[b];
    const float d = f16_to_f32(x.d), dmin = f16_to_f32(x.dmin);
    int8_t q[kQK_K];
    unpack_2bit(x.qs, q);
    for (int s = 0; s < 16; ++s) {  // sub-blocks of 16: low nibble scale, high nibble min
      const float dl = d * static_cast<float>(x.scales[s] & 0x0f);
      const float ml = dmin * static_cast<float>(x.scales[s] >> 4);
      for (int i = 0; i < 16; ++i) dst[16 * s + i] = dl * static_cast<float>(q[16 * s + i]) - ml;
    }
  }
}

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ3_K x = blocks[b];
    const float d = f16_to_f32(x.d);
    int8_t q[kQK_K];
    unpack_2bit(x.qs, q);
    for (int k = 0; k < 8; ++k) {  // a clear high bit of element 32k + l subtracts 4
      for (int l = 0; l < 32; ++l)
        q[32 * k + l] = static_cast<int8_t>(q[32 * k + l] - (((x.hmask[l] >> k) & 1) ^ 1) * 4);
    }
    for (int s = 0; s < 16; ++s) {  // sub-blocks of 16; the 6-bit scale is split over two bytes
      const int low = s < 8 ? (x.scales[s] & 0x0f) : (x.scales[s - 8] >> 4);
      const int high = (x.scales[8 + s % 4] >> (2 * (s / 4))) & 3;
      const float dl = d * static_cast<float>((low | high << 4) - 32);
      for (int i = 0; i < 16; ++i) dst[16 * s + i] = dl * static_cast<float>(q[16 * s + i]);
    }
  }
}

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ4_K x = blocks[b];
    int8_t q[kQK_K];
    unpack_4bit(x.qs, q);
    scale_k_sub_blocks(x.scales, f16_to_f32(x.d), f16_to_f32(x.dmin), q, dst);
  }
}

void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ5_K x = blocks[b];
    int8_t q[kQK_K];
    unpack_4bit(x.qs, q);
    for (int k = 0; k < 8; ++k) {  // bit k of qh[l] is the fifth bit of element 32k + l
      for (int l = 0; l < 32; ++l)
        q[32 * k + l] = static_cast<int8_t>(q[32 * k + l] | ((x.qh[l] >> k) & 1) << 4);
    }
    scale_k_sub_blocks(x.scales, f16_to_f32(x.d), f16_to_f32(x.dmin), q, dst);
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ6_K x = blocks[b];
    const float d = f16_to_f32(x.d);
    int8_t q[kQK_K];
    for (int h = 0; h < 2; ++h) {  // element 128h + r, r = 32k + l
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          const int low = (x.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
          const int high = (x.qh[32 * h + l] >> (2 * k)) & 3;
          q[128 * h + 32 * k + l] = static_cast<int8_t>((low | high << 4) - 32);
        }
      }
    }
    for (int s = 0; s < 16; ++s) {
      const float dl = d * static_cast<float>(x.scales[s]);
      for (int i = 0; i < 16; ++i) dst[16 * s + i] = dl * static_cast<float>(q[16 * s + i]);
    }
  }
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockIQ4_XS x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int s = 0; s < 8; ++s) {
      const int low = (x.scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
      const int high = (x.scales_h >> (2 * s)) & 3;
      const float dl = d * static_cast<float>((low | high << 4) - 32);
      const uint8_t* qs = x.qs + 16 * s;
      for (int l = 0; l < 16; ++l) dst[32 * s + l] = dl * static_cast<float>(kIq4nlValues[qs[l] & 0x0f]);
      for (int l = 0; l < 16; ++l) dst[32 * s + 16 + l] = dl * static_cast<float>(kIq4nlValues[qs[l] >> 4]);
    }
  }
}

}  // namespace ember
