// quant/quantize_k.cpp: reference quantizers of the k-quants (q2_k ... q6_k), following
// llama.cpp's quantize_row_qX_K_ref (no importance matrix): per sub-block, search for the scale
// (and min) that minimises a weighted error, quantize the sub-block scales themselves against one
// f16 super-block scale, then re-quantize every value with the scales as they will be decoded.
// gguf-py has no k-quant quantizer; these write the same bytes as llama.cpp's reference (built
// without FMA contraction), which tests/test_quant.py checks on fixed inputs.
#include <cmath>
#include <cstring>

#include "quant/blocks.h"
#include "quant/no_contract.h"
#include "quant/quant.h"
#include "quant/scale_search.h"

namespace ember {
namespace {

int clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Packs 256 2-bit values: element 128h + 32k + l goes to bits 2k of qs[32h + l].
void pack_2bit(const uint8_t* L, uint8_t qs[kQK_K / 4]) {
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                           L[j + l + 96] << 6);
    }
  }
}

// Stores the 6-bit scale ls and min lm of sub-block j of a q4_k / q5_k block (layout in blocks.h).
void put_k_scale_min(uint8_t scales[kKScaleBytes], int j, uint8_t ls, uint8_t lm) {
  if (j < 4) {
    scales[j] = ls;
    scales[j + 4] = lm;
  } else {
    scales[j + 4] = static_cast<uint8_t>((ls & 0x0f) | (lm & 0x0f) << 4);
    scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}

void get_k_scale_min(const uint8_t scales[kKScaleBytes], int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0x0f) | (scales[j - 4] >> 6) << 4;
    *m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
  }
}

// The shared part of q4_k and q5_k: 8 sub-blocks of 32 with 6-bit scales and mins, values in
// [0, nmax] written to L[256].
void quantize_k_scale_min_block(const float* x, int nmax, float rmin, float rdelta, int nstep,
                                uint16_t* d_out, uint16_t* dmin_out, uint8_t scales_out[kKScaleBytes],
                                uint8_t* L) {
  float scales[8], mins[8], weights[32];
  uint8_t aux[32];
  float max_scale = 0, max_min = 0;  // scales are positive as the min is taken out
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = fit_with_min(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], aux, rmin, rdelta, nstep,
                             false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    put_k_scale_min(scales_out, j, ls < 63 ? ls : 63, lm < 63 ? lm : 63);
  }
  *d_out = f32_to_f16(max_scale / 63.f);
  *dmin_out = f32_to_f16(max_min / 63.f);
  // Re-quantize against the scales exactly as the decoder will see them.
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    get_k_scale_min(scales_out, j, &sc, &m);
    const float d = f16_to_f32(*d_out) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = f16_to_f32(*dmin_out) * static_cast<float>(m);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = static_cast<uint8_t>(clamp(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
}

}  // namespace

// src[n], n a multiple of 256; dst receives n / 256 blocks.

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ2_K*>(dst);
  constexpr float kQ4Scale = 15.f;
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    BlockQ2_K& y = blocks[b];
    uint8_t L[kQK_K], aux[16];
    float weights[16], mins[16], scales[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(src[16 * j + l]);
      scales[j] = fit_with_min(16, 3, src + 16 * j, weights, L + 16 * j, &mins[j], aux, -0.5f, 0.1f, 15,
                               true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < 16; ++j) y.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y.d = f32_to_f16(max_scale / kQ4Scale);
    } else {
      std::memset(y.scales, 0, sizeof y.scales);
      y.d = f32_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < 16; ++j) y.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      y.dmin = f32_to_f16(max_min / kQ4Scale);
    } else {
      y.dmin = f32_to_f16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_f32(y.d) * static_cast<float>(y.scales[j] & 0x0f);
      if (d == 0.0f) continue;
      const float dm = f16_to_f32(y.dmin) * static_cast<float>(y.scales[j] >> 4);
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<uint8_t>(clamp(nearest_int((src[16 * j + i] + dm) / d), 0, 3));
    }
    pack_2bit(L, y.qs);
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ3_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    BlockQ3_K& y = blocks[b];
    int8_t L[kQK_K];
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = fit_symmetric_descent(16, 4, src + 16 * j, L + 16 * j);
    float amax;
    const float max_scale = largest_magnitude(16, scales, &amax);
    std::memset(y.scales, 0, sizeof y.scales);
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = clamp(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;  // 6 bits
        if (j < 8) {
          y.scales[j] = static_cast<uint8_t>(l & 0x0f);
        } else {
          y.scales[j - 8] |= static_cast<uint8_t>((l & 0x0f) << 4);
        }
        y.scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      }
      y.d = f32_to_f16(1 / iscale);
    } else {
      y.d = f32_to_f16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const int low = j < 8 ? (y.scales[j] & 0x0f) : (y.scales[j - 8] >> 4);
      const int sc = (low | ((y.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
      const float d = f16_to_f32(y.d) * static_cast<float>(sc);
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<int8_t>(clamp(nearest_int(src[16 * j + i] / d), -4, 3) + 4);
    }
    // The high bit of element 32k + l goes to bit k of hmask[l]; what is left is 2 bits.
    std::memset(y.hmask, 0, sizeof y.hmask);
    uint8_t low_bits[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      if (L[j] > 3) y.hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
      low_bits[j] = static_cast<uint8_t>(L[j] & 3);
    }
    pack_2bit(low_bits, y.qs);
  }
}

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    BlockQ4_K& y = blocks[b];
    uint8_t L[kQK_K];
    quantize_k_scale_min_block(src, 15, -1.f, 0.1f, 20, &y.d, &y.dmin, y.scales, L);
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j and 2j + 1 share qs[32j ...]
      for (int l = 0; l < 32; ++l)
        y.qs[32 * j + l] = static_cast<uint8_t>(L[64 * j + l] | L[64 * j + 32 + l] << 4);
    }
  }
}

void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    BlockQ5_K& y = blocks[b];
    uint8_t L[kQK_K];
    quantize_k_scale_min_block(src, 31, -0.5f, 0.1f, 15, &y.d, &y.dmin, y.scales, L);
    std::memset(y.qh, 0, sizeof y.qh);
    for (int j = 0; j < kQK_K; ++j) {
      if (L[j] > 15) y.qh[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
    }
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        y.qs[32 * j + l] = static_cast<uint8_t>((L[64 * j + l] & 0x0f) | (L[64 * j + 32 + l] & 0x0f) << 4);
      }
    }
  }
}

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    BlockQ6_K& y = blocks[b];
    int8_t L[kQK_K];
    float scales[16];
    for (int j = 0; j < 16; ++j) scales[j] = fit_symmetric(16, 32, src + 16 * j, L + 16 * j);
    float max_abs_scale;
    const float max_scale = largest_magnitude(16, scales, &max_abs_scale);
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y, 0, sizeof y);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y.d = f32_to_f16(1 / iscale);
    for (int j = 0; j < 16; ++j) {
      const int l = nearest_int(iscale * scales[j]);
      y.scales[j] = static_cast<int8_t>(l < 127 ? l : 127);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_f32(y.d) * static_cast<float>(y.scales[j]);
      if (d == 0.0f) continue;
      for (int i = 0; i < 16; ++i)
        L[16 * j + i] = static_cast<int8_t>(clamp(nearest_int(src[16 * j + i] / d), -32, 31) + 32);
    }
    // Element 128h + r: low nibble into ql[64h + r % 64] (nibble r / 64), high 2 bits into
    // qh[32h + r % 32] (bits 2 (r / 32)).
    std::memset(y.ql, 0, sizeof y.ql);
    std::memset(y.qh, 0, sizeof y.qh);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, r = e % 128;
      y.ql[64 * h + r % 64] |= static_cast<uint8_t>((L[e] & 0x0f) << (4 * (r / 64)));
      y.qh[32 * h + r % 32] |= static_cast<uint8_t>(((L[e] >> 4) & 3) << (2 * (r / 32)));
    }
  }
}

}  // namespace ember
