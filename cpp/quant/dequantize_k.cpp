// quant/dequantize_k.cpp: reference dequantizers of the 256-element super-block types (q2_k ...
// q6_k, iq4_xs). Bit for bit as gguf-py: each sub-block's scale (and min) is first multiplied out
// in f32 (d * sc), then applied to the f32 quant with one rounded multiply (and one rounded
// subtract of dmin * m), never as a fused or reassociated expression.
// Each block is copied to a local first: the float stores to dst could otherwise alias the
// source bytes, and the compiler would reload every byte instead of vectorizing the loops.
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/no_contract.h"

namespace ember {

// src holds n / 256 blocks (2-byte aligned); dst[n].

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ2_K x = blocks[b];
    const float d = f16_to_f32(x.d), dmin = f16_to_f32(x.dmin);
    for (int e = 0; e < kQK_K; e += 16) {  // one sub-block of 16: element e = 128h + 32k + l
      const float dl = d * static_cast<float>(x.scales[e / 16] & 0x0f);
      const float ml = dmin * static_cast<float>(x.scales[e / 16] >> 4);
      const int h = e / 128, k = (e / 32) % 4;
      for (int i = 0; i < 16; ++i) {
        const int l = e % 32 + i;
        const int q = (x.qs[32 * h + l] >> (2 * k)) & 3;
        dst[e + i] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ3_K x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int e = 0; e < kQK_K; e += 16) {
      const int j = e / 16;  // sub-block: its 6-bit scale is split over two bytes
      const int low = j < 8 ? (x.scales[j] & 0x0f) : (x.scales[j - 8] >> 4);
      const int high = (x.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = d * static_cast<float>((low | high << 4) - 32);
      const int h = e / 128, k = (e / 32) % 4;
      for (int i = 0; i < 16; ++i) {
        const int l = e % 32 + i;
        const int q = (x.qs[32 * h + l] >> (2 * k)) & 3;
        const int hbit = (x.hmask[l] >> (e / 32)) & 1;
        dst[e + i] = dl * static_cast<float>(q - (hbit ? 0 : 4));
      }
    }
  }
}

namespace {

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

}  // namespace

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ4_K x = blocks[b];
    const float d = f16_to_f32(x.d), dmin = f16_to_f32(x.dmin);
    for (int s = 0; s < 8; ++s) {  // sub-block s of 32 = nibble s % 2 of qs[32 * (s / 2) ...]
      int sc, m;
      k_scale_min(x.scales, s, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const uint8_t* qs = x.qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        dst[32 * s + l] = dl * static_cast<float>((qs[l] >> shift) & 0x0f) - ml;
      }
    }
  }
}

void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ5_K x = blocks[b];
    const float d = f16_to_f32(x.d), dmin = f16_to_f32(x.dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      k_scale_min(x.scales, s, &sc, &m);
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const uint8_t* qs = x.qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0x0f) | ((x.qh[l] >> s) & 1) << 4;
        dst[32 * s + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockQ6_K x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int e = 0; e < kQK_K; e += 16) {  // element e = 128h + r
      const float dl = d * static_cast<float>(x.scales[e / 16]);
      const int h = e / 128;
      for (int i = 0; i < 16; ++i) {
        const int r = e % 128 + i;
        const int low = (x.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        const int high = (x.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        dst[e + i] = dl * static_cast<float>((low | high << 4) - 32);
      }
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
      for (int l = 0; l < 16; ++l) {
        dst[32 * s + l] = dl * static_cast<float>(kIq4nlValues[qs[l] & 0x0f]);
        dst[32 * s + 16 + l] = dl * static_cast<float>(kIq4nlValues[qs[l] >> 4]);
      }
    }
  }
}

}  // namespace ember
