// quant/dequantize_iq.cpp: reference dequantizers of the i-quants with codebooks (iq2_xxs, iq2_xs,
// iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m). Each reproduces gguf-py's numpy arithmetic bit for bit:
// the scale is formed in f32 with the same roundings in the same order, then x = (scale * grid)
// with the sign applied after (exact), or for iq1 x = scale * (grid + delta). Layouts are in
// quant/blocks.h, grids in quant/iq_grids.h.
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq_grids.h"
#include "quant/no_contract.h"
#include "quant/quant.h"

namespace ember {
namespace {

// dst[8] = db * row values, element j negated where bit j of signs is set.
inline void signed_row8(float db, uint64_t row, uint8_t signs, float* dst) {
  for (int j = 0; j < 8; ++j) {
    const float v = db * static_cast<float>(grid_value(row, j));
    dst[j] = (signs >> j) & 1 ? -v : v;
  }
}

inline void signed_row4(float db, uint32_t row, uint8_t signs, int shift, float* dst) {
  for (int j = 0; j < 4; ++j) {
    const float v = db * static_cast<float>(grid_value(row, j));
    dst[j] = (signs >> (shift + j)) & 1 ? -v : v;
  }
}

inline uint32_t u32_at(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// d * (0.5 + s) * factor, as gguf-py rounds it.
inline float half_step_scale(float d, uint32_t s, float factor) {
  return d * (0.5f + static_cast<float>(s)) * factor;
}

}  // namespace

void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XXS*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ2_XXS& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int ib = 0; ib < 8; ++ib, dst += 32) {
      const uint32_t grid = u32_at(&x.qs[4 * ib]), aux = u32_at(&x.qs[4 * ib + 2]);
      const float db = half_step_scale(d, aux >> 28, 0.25f);
      for (int l = 0; l < 4; ++l) {
        signed_row8(db, kIq2xxsGrid[(grid >> (8 * l)) & 0xff], kIqSigns[(aux >> (7 * l)) & 127], dst + 8 * l);
      }
    }
  }
}

void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ2_XS& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int k = 0; k < 32; ++k, dst += 8) {
      const int g = k / 2;  // 16-element group
      const float db = half_step_scale(d, (x.scales[g / 2] >> (4 * (g % 2))) & 15, 0.25f);
      signed_row8(db, kIq2xsGrid[x.qs[k] & 511], kIqSigns[x.qs[k] >> 9], dst);
    }
  }
}

void dequantize_row_iq2_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_S*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ2_S& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int k = 0; k < 32; ++k, dst += 8) {
      const int g = k / 2;
      const float db = half_step_scale(d, (x.scales[g / 2] >> (4 * (g % 2))) & 15, 0.25f);
      const int index = x.qs[k] | ((x.qh[k / 4] >> (2 * (k % 4))) & 3) << 8;
      signed_row8(db, kIq2sGrid[index], x.signs[k], dst);
    }
  }
}

void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_XXS*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ3_XXS& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int ib = 0; ib < 8; ++ib, dst += 32) {
      const uint32_t aux = u32_at(x.qs + kQK_K / 4 + 4 * ib);
      const float db = half_step_scale(d, aux >> 28, 0.5f);
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = kIqSigns[(aux >> (7 * l)) & 127];
        const uint8_t* q = x.qs + 8 * ib + 2 * l;
        signed_row4(db, kIq3xxsGrid[q[0]], signs, 0, dst + 8 * l);
        signed_row4(db, kIq3xxsGrid[q[1]], signs, 4, dst + 8 * l + 4);
      }
    }
  }
}

void dequantize_row_iq3_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_S*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ3_S& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int ib = 0; ib < 8; ++ib) {
      const int s = (x.scales[ib / 2] >> (4 * (ib % 2))) & 15;
      const float db = d * static_cast<float>(1 + 2 * s);
      for (int k = 8 * ib; k < 8 * ib + 8; ++k, dst += 4) {
        const int index = x.qs[k] | ((x.qh[k / 8] >> (k % 8)) & 1) << 8;
        signed_row4(db, kIq3sGrid[index], x.signs[k / 2], 4 * (k % 2), dst);
      }
    }
  }
}

namespace {

// dst[8] = dl * (row values + delta).
inline void iq1_row(float dl, uint64_t row, float delta, float* dst) {
  for (int j = 0; j < 8; ++j) dst[j] = dl * (static_cast<float>(grid_value(row, j)) + delta);
}

}  // namespace

void dequantize_row_iq1_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_S*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ1_S& x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t h = x.qh[ib];
      const float dl = d * static_cast<float>(2 * ((h >> 12) & 7) + 1);
      const float delta = h & 0x8000 ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, dst += 8) {
        iq1_row(dl, kIq1sGrid[x.qs[4 * ib + l] | ((h >> (3 * l)) & 7) << 8], delta, dst);
      }
    }
  }
}

void dequantize_row_iq1_m(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_M*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const BlockIQ1_M& x = blocks[b];
    uint16_t sc[4];
    std::memcpy(sc, x.scales, sizeof(sc));
    const uint16_t d_bits = static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 8 & 0x00f0) |
                                                  (sc[2] >> 4 & 0x0f00) | (sc[3] & 0xf000));
    const float d = f16_to_f32(d_bits);
    for (int k = 0; k < 32; ++k, dst += 8) {
      const int g = k / 2;
      const float dl = d * static_cast<float>(2 * ((sc[g / 4] >> (3 * (g % 4))) & 7) + 1);
      const int nib = (x.qh[k / 2] >> (4 * (k % 2))) & 15;
      iq1_row(dl, kIq1sGrid[x.qs[k] | (nib & 7) << 8], nib & 8 ? -kIq1Delta : kIq1Delta, dst);
    }
  }
}

}  // namespace ember
