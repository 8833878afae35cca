// cpu/x86/vec_dot_x86.h: the shared shape of the x86 vec_dot kernels. One weight row · one int8
// activation row, 32-element block by block: the block's integer dot product per 16-element half
// comes from `BlockDot` (AVX2 maddubs or AVX-512 VNNI), then the float scales are applied.
// Included only by *_avx2.cpp / *_avx512.cpp files; internal linkage (see block_formats.h).
#pragma once

#include <immintrin.h>

#include "cpu/matmul_kernels.h"
#include "cpu/quantize_act.h"
#include "cpu/x86/block_formats_x86.h"

namespace ember::cpu {
namespace {

inline float hsum_x86(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Decode streams weights from DRAM, and the hardware prefetcher alone keeps too few lines in
// flight for one core to reach its share of the bandwidth: each step asks for the bytes
// kPrefetchBytes ahead (past the row's end that is the next row, which the same thread reads
// next). Measured on a 2048 x 65536 q4_0 matrix (75 MB, one thread, kernel_bench): 3.5 -> 8.4
// GB/s; 1024 bytes ahead gave 4.4, 4096 gave 8.3.
constexpr int64_t kPrefetchBytes = 2048;

// One 32-element block of the row into the running sums (acc: scaled integer dots per lane;
// acc_min: the min / offset terms Σ (min - kBias * scale) * d_a * Σa).
template <typename F, typename BlockDot>
inline void add_block_x86(const void* w_row, int64_t b, const BlockScales& s, const BlockQ8A& a, __m256& acc,
                          float& acc_min) {
  constexpr int kBias = BlockDot::template bias<F>();
  const __m256i u = quants_x86(F{}, w_row, b);
  const __m256i dot = BlockDot::template dot<F>(u,
                                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)));
  if constexpr (F::kSub16) {
    const __m256 sv = _mm256_set_m128(_mm_set1_ps(s.scale[1] * a.d), _mm_set1_ps(s.scale[0] * a.d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sv, acc);
    acc_min += (s.min[0] - kBias * s.scale[0]) * a.s_lo + (s.min[1] - kBias * s.scale[1]) * (a.s - a.s_lo);
  } else {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s.scale[0] * a.d), acc);
    acc_min += (s.min[0] - kBias * s.scale[0]) * a.s;
  }
}

// Σ_b over the row of Σ_i weight[i] * act[i], with BlockDot::dot(u, a) giving 8 int32 lanes
// (lanes 0-3 sum elements 0..15, lanes 4-7 elements 16..31) of Σ (u - BlockDot::bias<F>) * a.
// Blocks go in pairs into two sets of register accumulators, so consecutive blocks do not wait
// on each other's adds.
template <typename F, typename BlockDot>
float vec_dot_quant_x86(int64_t n_in, const void* w_row, const void* act_row) {
  using Block = typename F::Block;
  // Blocks per step: a whole super-block (K-quants), else a pair of blocks.
  constexpr int kStep = F::kBlocksPer > 1 ? F::kBlocksPer : 2;
  static_assert(kStep % 2 == 0);
  const auto* act = static_cast<const BlockQ8A*>(act_row);
  const auto* w = static_cast<const char*>(w_row);
  const int64_t n_blocks = n_in / 32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float min0 = 0.0f, min1 = 0.0f;
  int64_t b = 0;
  for (; b + kStep <= n_blocks; b += kStep) {
    const int64_t offset = b / F::kBlocksPer * static_cast<int64_t>(sizeof(Block));
    constexpr int64_t kStepBytes = sizeof(Block) * kStep / F::kBlocksPer;
    for (int64_t line = 0; line < kStepBytes; line += 64)
      _mm_prefetch(w + offset + kPrefetchBytes + line, _MM_HINT_T0);
    BlockScales s[kStep];
    for (int g = 0; g < kStep / F::kBlocksPer; ++g)
      F::scales_all(w_row, b / F::kBlocksPer + g, s + g * F::kBlocksPer);
#pragma GCC unroll 8
    for (int j = 0; j < kStep; j += 2) {
      add_block_x86<F, BlockDot>(w_row, b + j, s[j], act[b + j], acc0, min0);
      add_block_x86<F, BlockDot>(w_row, b + j + 1, s[j + 1], act[b + j + 1], acc1, min1);
    }
  }
  if constexpr (F::kBlocksPer == 1) {
    if (b < n_blocks) {  // an odd last block
      BlockScales s;
      F::scales_all(w_row, b, &s);
      add_block_x86<F, BlockDot>(w_row, b, s, act[b], acc0, min0);
    }
  }
  return hsum_x86(_mm256_add_ps(acc0, acc1)) + (min0 + min1);
}

// Float weights (f32 / f16 / bf16) against f32 activations; Load gives 8 weights as f32.
template <typename Load>
float vec_dot_float_x86(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* x = static_cast<const float*>(act_row);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n_in; i += 16) {
    // 32 or 64 weight bytes a step: one prefetch per step covers the stream (see kPrefetchBytes).
    _mm_prefetch(static_cast<const char*>(w_row) + i * Load::kBytes + kPrefetchBytes, _MM_HINT_T0);
    acc0 = _mm256_fmadd_ps(Load::load8(w_row, i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(Load::load8(w_row, i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  float sum = hsum_x86(_mm256_add_ps(acc0, acc1));
  for (; i < n_in; ++i) sum += Load::load1(w_row, i) * x[i];
  return sum;
}

struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  static __m256 load8(const void* w, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(w) + i); }
  static float load1(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  static __m256 load8(const void* w, int64_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  }
  static float load1(const void* w, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(w)[i]); }
};
struct LoadBF16 {
  static constexpr int64_t kBytes = 2;
  // bf16 is the top half of an f32: widen and shift, exact.
  static __m256 load8(const void* w, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float load1(const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); }
};

// AVX2 quantize_act: the same float operations as quantize_act_row_ref, so the same bytes.
inline void quantize_act_x86(const float* x, BlockQ8A* dst, int64_t n, int blocks_per_scale) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const int64_t run = 32 * int64_t{blocks_per_scale};
  for (int64_t r = 0; r < n / run; ++r, x += run) {
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = 0; i < run; i += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int b = 0; b < blocks_per_scale; ++b) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + 8 * k), _mm256_set1_ps(id)));
      }
      // Sums before packing (exact in int32); pack to bytes keeping element order.
      const __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
      const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
      __m256i p = _mm256_packs_epi16(p01, p23);
      p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      BlockQ8A& out = dst[r * blocks_per_scale + b];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs), p);
      const auto hsum_i = [](__m256i s) {
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        return _mm_cvtsi128_si32(t);
      };
      const int sum_lo = hsum_i(s01), sum_hi = hsum_i(s23);
      out.d = d;
      out.s = d * static_cast<float>(sum_lo + sum_hi);
      out.s_lo = d * static_cast<float>(sum_lo);
    }
  }
}

// The vec_dot entries every x86 table shares: the float types', and the quantized types' through
// BlockDot, each with gemm_cols columns per panel (the table's GEMMs fill in the rest).
template <typename BlockDot>
IsaKernels x86_vec_dot_table(IsaLevel level, int64_t gemm_cols) {
  IsaKernels t;
  t.level = level;
  t.quantize_act = quantize_act_x86;
  auto set = [&t](DType type, TypeKernels k) { t.types[static_cast<uint32_t>(type)] = k; };
  set(DType::f32, {ActFormat::f32, vec_dot_float_x86<LoadF32>, nullptr, gemm_cols});
  set(DType::f16, {ActFormat::f32, vec_dot_float_x86<LoadF16>, nullptr, gemm_cols});
  set(DType::bf16, {ActFormat::f32, vec_dot_float_x86<LoadBF16>, nullptr, gemm_cols});
  for_each_block_format([&](DType type, auto format) {
    set(type, {ActFormat::q8a, vec_dot_quant_x86<decltype(format), BlockDot>, nullptr, gemm_cols});
  });
  return t;
}

}  // namespace
}  // namespace ember::cpu
