// cuda/dequant.cuh: one group of 32 consecutive values of a weight row, dequantized in registers
// exactly as the reference dequantizers of quant/ (gguf-py's arithmetic: the integer quant, then
// one rounded multiply, and one rounded add or subtract for types with a minimum; __fmul_rn and
// __fadd_rn keep nvcc from fusing them into an FMA, which would change the bits).
//   Weight<T>::row_bytes(n_in): bytes of one row;
//   Weight<T>::kPartialGroups: rows may end inside a group of 32 (the float types);
//   Weight<T>::dq32(row, g, n_in, v): values 32g .. 32g+31 of the row at `row` (values past
//   n_in read as 0: only float types allow n_in not a multiple of 32).
// Block layouts are quant/blocks.h's structs, read in place from the file's bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "quant/blocks.h"
#include "quant/types.h"

namespace ember::cuda {

__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }

// d * q, rounded once.
__device__ __forceinline__ float mul(float d, float q) { return __fmul_rn(d, q); }

template <DType T>
struct Weight;

template <>
struct Weight<DType::f32> {
  static constexpr bool kPartialGroups = true;
  static constexpr int64_t row_bytes(int64_t n_in) { return 4 * n_in; }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t n_in, float v[32]) {
    const float* w = reinterpret_cast<const float*>(row);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = 32 * g + l < n_in ? w[32 * g + l] : 0.0f;
  }
};

template <>
struct Weight<DType::f16> {
  static constexpr bool kPartialGroups = true;
  static constexpr int64_t row_bytes(int64_t n_in) { return 2 * n_in; }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t n_in, float v[32]) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = 32 * g + l < n_in ? f16_to_f32(w[32 * g + l]) : 0.0f;
  }
};

template <>
struct Weight<DType::bf16> {
  static constexpr bool kPartialGroups = true;
  static constexpr int64_t row_bytes(int64_t n_in) { return 2 * n_in; }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t n_in, float v[32]) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int l = 0; l < 32; ++l)
      v[l] = 32 * g + l < n_in ? __uint_as_float(uint32_t{w[32 * g + l]} << 16) : 0.0f;
  }
};

// q4_0 and iq4_nl: d, qs[16]; value j is the low nibble of qs[j], j + 16 the high one; the nibble
// is a level q - 8 (q4_0) or an index into the iq4_nl codebook.
__constant__ static const int8_t kIq4nlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                     1,    13,   25,  38,  53,  69,  89,  113};

template <>
struct Weight<DType::q4_0> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockQ4_0); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(row) + g;
    const float d = f16_to_f32(b->d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = mul(d, static_cast<float>((b->qs[j] & 15) - 8));
      v[j + 16] = mul(d, static_cast<float>((b->qs[j] >> 4) - 8));
    }
  }
};

template <>
struct Weight<DType::iq4_nl> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockIQ4_NL); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockIQ4_NL* b = reinterpret_cast<const BlockIQ4_NL*>(row) + g;
    const float d = f16_to_f32(b->d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = mul(d, static_cast<float>(kIq4nlLevels[b->qs[j] & 15]));
      v[j + 16] = mul(d, static_cast<float>(kIq4nlLevels[b->qs[j] >> 4]));
    }
  }
};

template <>
struct Weight<DType::q4_1> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockQ4_1); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ4_1* b = reinterpret_cast<const BlockQ4_1*>(row) + g;
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      v[j] = __fadd_rn(mul(d, static_cast<float>(b->qs[j] & 15)), m);
      v[j + 16] = __fadd_rn(mul(d, static_cast<float>(b->qs[j] >> 4)), m);
    }
  }
};

// The 32 fifth bits of q5_0 / q5_1, stored as 4 bytes (not 4-byte aligned in the block).
__device__ __forceinline__ uint32_t load_qh(const uint8_t* qh) {
  return uint32_t{qh[0]} | uint32_t{qh[1]} << 8 | uint32_t{qh[2]} << 16 | uint32_t{qh[3]} << 24;
}

template <>
struct Weight<DType::q5_0> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockQ5_0); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ5_0* b = reinterpret_cast<const BlockQ5_0*>(row) + g;
    const float d = f16_to_f32(b->d);
    const uint32_t qh = load_qh(b->qh);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int lo = (b->qs[j] & 15) | ((qh >> j) & 1) << 4, hi = (b->qs[j] >> 4) | ((qh >> (j + 16)) & 1)
                                                                                        << 4;
      v[j] = mul(d, static_cast<float>(lo - 16));
      v[j + 16] = mul(d, static_cast<float>(hi - 16));
    }
  }
};

template <>
struct Weight<DType::q5_1> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockQ5_1); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ5_1* b = reinterpret_cast<const BlockQ5_1*>(row) + g;
    const float d = f16_to_f32(b->d), m = f16_to_f32(b->m);
    const uint32_t qh = load_qh(b->qh);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int lo = (b->qs[j] & 15) | ((qh >> j) & 1) << 4, hi = (b->qs[j] >> 4) | ((qh >> (j + 16)) & 1)
                                                                                        << 4;
      v[j] = __fadd_rn(mul(d, static_cast<float>(lo)), m);
      v[j + 16] = __fadd_rn(mul(d, static_cast<float>(hi)), m);
    }
  }
};

template <>
struct Weight<DType::q8_0> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 32 * sizeof(BlockQ8_0); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + g;
    const float d = f16_to_f32(b->d);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = mul(d, static_cast<float>(b->qs[j]));
  }
};

// Q2_K / Q3_K keep 2 low bits of element 128h + 32k + l (h < 2, k < 4) at bits 2k, 2k+1 of
// qs[32h + l]; values 32r .. 32r+31 of a super-block: bits 2(r % 4) of qs[32(r / 4) + l].
__device__ __forceinline__ int low_bits(const uint8_t* qs, int r, int l) {
  return (qs[32 * (r / 4) + l] >> (2 * (r % 4))) & 3;
}

template <>
struct Weight<DType::q2_k> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 256 * sizeof(BlockQ2_K); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ2_K* b = reinterpret_cast<const BlockQ2_K*>(row) + g / 8;
    const int r = static_cast<int>(g % 8);
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int sc = b->scales[2 * r + j];  // the sub-block of 16
      const float dl = mul(d, static_cast<float>(sc & 15)), ml = mul(dmin, static_cast<float>(sc >> 4));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * j + i;
        v[l] = __fsub_rn(mul(dl, static_cast<float>(low_bits(b->qs, r, l))), ml);
      }
    }
  }
};

template <>
struct Weight<DType::q3_k> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 256 * sizeof(BlockQ3_K); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ3_K* b = reinterpret_cast<const BlockQ3_K*>(row) + g / 8;
    const int r = static_cast<int>(g % 8);
    const float d = f16_to_f32(b->d);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int s = 2 * r + j;
      const int low = s < 8 ? b->scales[s] & 15 : b->scales[s - 8] >> 4;
      const int high = (b->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
      const float dl = mul(d, static_cast<float>((low | high << 4) - 32));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * j + i;
        const int hbit = (b->hmask[l] >> r) & 1;  // clear: the quant is 4 lower
        v[l] = mul(dl, static_cast<float>(low_bits(b->qs, r, l) - (4 - 4 * hbit)));
      }
    }
  }
};

// Q4_K / Q5_K: the six-bit scale and min of sub-block s (quant/blocks.h).
__device__ __forceinline__ void k_scale_min(const uint8_t* scales, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *m = scales[s + 4] & 63;
  } else {
    *sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4;
    *m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
  }
}

template <>
struct Weight<DType::q4_k> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 256 * sizeof(BlockQ4_K); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ4_K* b = reinterpret_cast<const BlockQ4_K*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    int sc, m;
    k_scale_min(b->scales, s, &sc, &m);
    const float dl = mul(f16_to_f32(b->d), static_cast<float>(sc));
    const float ml = mul(f16_to_f32(b->dmin), static_cast<float>(m));
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (b->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
      v[l] = __fsub_rn(mul(dl, static_cast<float>(q)), ml);
    }
  }
};

template <>
struct Weight<DType::q5_k> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 256 * sizeof(BlockQ5_K); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ5_K* b = reinterpret_cast<const BlockQ5_K*>(row) + g / 8;
    const int s = static_cast<int>(g % 8);
    int sc, m;
    k_scale_min(b->scales, s, &sc, &m);
    const float dl = mul(f16_to_f32(b->d), static_cast<float>(sc));
    const float ml = mul(f16_to_f32(b->dmin), static_cast<float>(m));
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = ((b->qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15) | ((b->qh[l] >> s) & 1) << 4;
      v[l] = __fsub_rn(mul(dl, static_cast<float>(q)), ml);
    }
  }
};

template <>
struct Weight<DType::q6_k> {
  static constexpr bool kPartialGroups = false;
  static constexpr int64_t row_bytes(int64_t n_in) { return n_in / 256 * sizeof(BlockQ6_K); }
  __device__ static void dq32(const uint8_t* row, int64_t g, int64_t, float v[32]) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(row) + g / 8;
    const int r = static_cast<int>(g % 8), h = r / 4, k = r % 4;  // values 32r .. 32r+31
    const float d = f16_to_f32(b->d);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int low = (b->ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
      const int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
      const float dl = mul(d, static_cast<float>(b->scales[(32 * r + l) / 16]));
      v[l] = mul(dl, static_cast<float>((low | high << 4) - 32));
    }
  }
};

// Calls f.template operator()<T>() for the weight type t (a table of the types with kernels,
// not a switch per op); returns false for a type without them.
template <typename F>
bool with_weight_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: f.template operator()<DType::f32>(); return true;
    case DType::f16: f.template operator()<DType::f16>(); return true;
    case DType::bf16: f.template operator()<DType::bf16>(); return true;
    case DType::q4_0: f.template operator()<DType::q4_0>(); return true;
    case DType::q4_1: f.template operator()<DType::q4_1>(); return true;
    case DType::q5_0: f.template operator()<DType::q5_0>(); return true;
    case DType::q5_1: f.template operator()<DType::q5_1>(); return true;
    case DType::q8_0: f.template operator()<DType::q8_0>(); return true;
    case DType::iq4_nl: f.template operator()<DType::iq4_nl>(); return true;
    case DType::q2_k: f.template operator()<DType::q2_k>(); return true;
    case DType::q3_k: f.template operator()<DType::q3_k>(); return true;
    case DType::q4_k: f.template operator()<DType::q4_k>(); return true;
    case DType::q5_k: f.template operator()<DType::q5_k>(); return true;
    case DType::q6_k: f.template operator()<DType::q6_k>(); return true;
    default: return false;
  }
}

}  // namespace ember::cuda
