// quant/quantize_iq4.cpp: the iq4_nl and iq4_xs quantizers, by llama.cpp's search (no importance
// matrix, weights x^2): per 32-block, the scale through the block's largest value and 15 trial
// scales around it, each with the weighted least-squares scale for its nearest codebook levels,
// the best kept; iq4_xs then stores the block scales as 6-bit multiples of one f16 d.
#include <cmath>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/scale_search.h"

namespace ember {
namespace {

constexpr int kTries = 7;  // trial scales on each side, as llama-quantize

// The index of the codebook level nearest v (the lower of two equally near).
int nearest_level(float v) {
  if (v <= kIq4nlValues[0]) return 0;
  if (v >= kIq4nlValues[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (v < kIq4nlValues[mid] ? hi : lo) = mid;
  }
  return v - kIq4nlValues[hi - 1] < kIq4nlValues[hi] - v ? hi - 1 : hi;
}

// The scale of one 32-block x ~ scale * kIq4nlValues[L]; 0 for a block of (near) zeros.
float block_scale(const float* x) {
  float amax;
  const float max = largest_magnitude(32, x, &amax);
  if (amax < kGroupMaxEps) return 0.0f;
  auto fit = [x](float id, float* sumqx, float* sumq2) {
    *sumqx = *sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = kIq4nlValues[nearest_level(id * x[j])], w = x[j] * x[j];
      *sumqx += w * q * x[j];
      *sumq2 += w * q * q;
    }
  };
  float sumqx, sumq2;
  fit(1.0f / (-max / kIq4nlValues[0]), &sumqx, &sumq2);
  float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f, best = d * sumqx;
  for (int t = -kTries; t <= kTries; ++t) {
    fit((t + kIq4nlValues[0]) / max, &sumqx, &sumq2);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// 32 values as nibbles of their nearest levels at scale d (both halves share qs[j]).
void pack_levels(const float* x, float d, uint8_t qs[16]) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>(nearest_level(id * x[j]) | nearest_level(id * x[j + 16]) << 4);
  }
}

}  // namespace

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / kQK; ++b, src += kQK) {
    const float d = block_scale(src);
    blocks[b].d = f32_to_f16(d);
    pack_levels(src, d, blocks[b].qs);
  }
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b, src += kQK_K) {
    float scales[8], max_scale = 0.0f, amax_scale = 0.0f;
    for (int i = 0; i < 8; ++i) {
      scales[i] = block_scale(src + 32 * i);
      if (std::fabs(scales[i]) > amax_scale) {
        amax_scale = std::fabs(scales[i]);
        max_scale = scales[i];
      }
    }
    BlockIQ4_XS& y = blocks[b];
    const float d = -max_scale / 32;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y.d = f32_to_f16(d);
    y.scales_h = 0;
    for (int i = 0; i < 8; ++i) {
      int l = nearest_int(id * scales[i]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      pack_levels(src + 32 * i, d * static_cast<float>(l), y.qs + 16 * i);
      l += 32;
      if (i % 2 == 0) y.scales_l[i / 2] = static_cast<uint8_t>(l & 15);
      else y.scales_l[i / 2] |= static_cast<uint8_t>((l & 15) << 4);
      y.scales_h = static_cast<uint16_t>(y.scales_h | (l >> 4) << (2 * i));
    }
  }
}

}  // namespace ember
