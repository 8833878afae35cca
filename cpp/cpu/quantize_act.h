// cpu/quantize_act.h: the int8 form of activations that quantized-weight dot products consume.
// One block format for every weight type: 32 values with an f32 scale and the block's sums (the
// sums carry the min / offset terms of the weight formats, see block_formats.h). A row's blocks
// take their scale one by one, or 8 at a time (the K-quants' 256-element super-blocks, whose
// kernels then sum a whole super-block in integers: ActFormat::q8a_k).
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

// dst[n / 32] = x[n] quantized, n a multiple of 32 * blocks_per_scale. Each run of
// blocks_per_scale blocks shares d = max|x| over it / 127; q = x * (1/d) rounded to nearest even.
// The SIMD twins (kernel tables) produce bit-identical blocks.
void quantize_act_row_ref(const float* x, BlockQ8A* dst, int64_t n, int blocks_per_scale);

}  // namespace ember::cpu
