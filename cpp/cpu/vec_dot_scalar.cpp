// cpu/vec_dot_scalar.cpp: the scalar reference kernels (one vec_dot per weight type) that every
// SIMD variant is tested against, and the fallback table for CPUs without a SIMD level.
// They follow block_formats.h literally: integer dot of (u - bias) with the int8 activations per
// 16-element half, then the float scales, so they are slow but obviously right.
#include <cstddef>

#include "cpu/block_formats.h"
#include "cpu/matmul_kernels.h"

namespace ember::cpu {
namespace {

template <typename Format>
float vec_dot_quant(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* act = static_cast<const BlockQ8A*>(act_row);
  float sum = 0.0f;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    BlockScales sc;
    uint8_t u[32];
    Format::scales(w_row, b, &sc);
    Format::quants(w_row, b, u);
    const BlockQ8A& a = act[b];
    const float a_sum[2] = {a.s_lo, a.s - a.s_lo};  // d_a * Σ a over each half
    for (int h = 0; h < 2; ++h) {
      int32_t dot = 0;
      for (int l = 16 * h; l < 16 * h + 16; ++l) dot += (u[l] - Format::kBias) * a.qs[l];
      sum += sc.scale[h] * a.d * static_cast<float>(dot) + sc.min[h] * a_sum[h];
    }
  }
  return sum;
}

float vec_dot_f32(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* w = static_cast<const float*>(w_row);
  const auto* x = static_cast<const float*>(act_row);
  float sum = 0.0f;
  for (int64_t i = 0; i < n_in; ++i) sum += w[i] * x[i];
  return sum;
}

float vec_dot_f16(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* w = static_cast<const uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act_row);
  float sum = 0.0f;
  for (int64_t i = 0; i < n_in; ++i) sum += f16_to_f32(w[i]) * x[i];
  return sum;
}

float vec_dot_bf16(int64_t n_in, const void* w_row, const void* act_row) {
  const auto* w = static_cast<const uint16_t*>(w_row);
  const auto* x = static_cast<const float*>(act_row);
  float sum = 0.0f;
  for (int64_t i = 0; i < n_in; ++i) sum += bf16_to_f32(w[i]) * x[i];
  return sum;
}

template <typename Format>
constexpr TypeKernels quant_kernels() {
  return {ActFormat::q8a, vec_dot_quant<Format>, nullptr, 1};
}

constexpr IsaKernels make_table() {
  IsaKernels t;
  t.level = IsaLevel::scalar;
  t.quantize_act = quantize_act_row_ref;
  auto set = [&t](DType type, TypeKernels k) { t.types[static_cast<uint32_t>(type)] = k; };
  set(DType::f32, {ActFormat::f32, vec_dot_f32, nullptr, 1});
  set(DType::f16, {ActFormat::f32, vec_dot_f16, nullptr, 1});
  set(DType::bf16, {ActFormat::f32, vec_dot_bf16, nullptr, 1});
  for_each_block_format([&](DType type, auto format) { set(type, quant_kernels<decltype(format)>()); });
  return t;
}

constexpr IsaKernels kScalarKernels = make_table();

}  // namespace

const IsaKernels& isa_kernels_scalar() { return kScalarKernels; }

}  // namespace ember::cpu
