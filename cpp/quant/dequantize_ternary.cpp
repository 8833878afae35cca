// quant/dequantize_ternary.cpp: reference dequantizers of the ternary types tq1_0 and tq2_0
// (x = d * (t - 1), t in {0, 1, 2}); as gguf-py, the trit minus one is converted to f32 and scaled
// with one rounded multiply. Layouts are in quant/blocks.h.
#include "quant/blocks.h"
#include "quant/no_contract.h"
#include "quant/quant.h"

namespace ember {

void dequantize_row_tq1_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ1_0*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockTQ1_0 x = blocks[b];
    const float d = f16_to_f32(x.d);
    float* y = dst;
    for (int t = 0; t < 5; ++t) {
      for (int l = 0; l < 32; ++l) *y++ = d * static_cast<float>(tq1_trit(x.qs[l], t) - 1);
    }
    for (int t = 0; t < 5; ++t) {
      for (int l = 0; l < 16; ++l) *y++ = d * static_cast<float>(tq1_trit(x.qs[32 + l], t) - 1);
    }
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 4; ++l) *y++ = d * static_cast<float>(tq1_trit(x.qh[l], t) - 1);
    }
  }
}

void dequantize_row_tq2_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockTQ2_0*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const BlockTQ2_0 x = blocks[b];
    const float d = f16_to_f32(x.d);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          dst[128 * h + 32 * k + l] = d * static_cast<float>(((x.qs[32 * h + l] >> (2 * k)) & 3) - 1);
        }
      }
    }
  }
}

}  // namespace ember
