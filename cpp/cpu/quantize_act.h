// cpu/quantize_act.h: the int8 form of activations that quantized-weight dot products consume.
// One format for every weight type: 32 values per block with an f32 scale and the block's sums
// (the sums carry the min / offset terms of the weight formats, see block_formats.h).
#pragma once

#include <cstdint>

namespace ember::cpu {

// x[i] ≈ d * qs[i], qs in [-127, 127]; s = d * Σqs[0..32), s_lo = d * Σqs[0..16).
struct BlockQ8A {
  float d;
  float s;
  float s_lo;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8A) == 44);

// dst[n / 32] = x[n] quantized, n a multiple of 32. Rounding: d = max|x| / 127, q = x * (1/d)
// rounded to nearest even; the SIMD twins (kernel tables) produce bit-identical blocks.
void quantize_act_row_ref(const float* x, BlockQ8A* dst, int64_t n);

}  // namespace ember::cpu
