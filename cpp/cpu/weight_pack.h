// cpu/weight_pack.h: the column-interleaved weight layout the avx512 / amx matmul kernels read
// for some quantized types and the float types, built once at load from the file's rows (CpuBackend::
// prepare_matmul_weight). Knows nothing of ISAs: the packers are plain byte moves.
//
// Why: decode (one activation row) reads every weight once, and in the file's layout a kernel
// that keeps 16 output columns in the 16 lanes of a vector must gather 16 rows per step and
// re-shuffle every block (vpdpbusd per column, then horizontal adds). Interleaved, one 64-byte
// load holds 4 quant bytes of each of 16 columns, which is exactly a vpdpbusd operand against a
// broadcast 4-byte activation group, and a thread's columns are one contiguous stream.
//
// Layout of a packed {n_in, n_out} tensor: [ceil(n_out / 16) column groups][n_in / block_size
// blocks (32, or 256 for K-quants, 1 for floats)] of the type's Packed struct below; group g holds columns
// 16g .. 16g + 15 (past n_out: zero). Each group is 16 * row_bytes(type, n_in) bytes, so group g starts at
// byte 16g * row_bytes: the same offset as column 16g's row in the file, and the tensor is as large as the
// file's (plus the zero columns of a last partial group).
#pragma once

#include <cstdint>

#include "quant/blocks.h"
#include "quant/types.h"

namespace ember::cpu {

inline constexpr int kPackCols = 16;

// One 32-element block of 16 columns. qs[k][c] holds column c's file bytes qs[4k .. 4k + 3]:
// low nibbles are elements 4k .. 4k + 3, high nibbles elements 16 + 4k .. 16 + 4k + 3.
struct PackedQ4_0 {
  uint16_t d[kPackCols];  // f16 scales
  uint8_t qs[4][kPackCols][4];
};
static_assert(sizeof(PackedQ4_0) == kPackCols * sizeof(BlockQ4_0));

struct PackedQ4_1 {
  uint16_t d[kPackCols];        // f16 scales
  uint16_t m[kPackCols];        // f16 minimums
  uint8_t qs[4][kPackCols][4];  // as PackedQ4_0
};
static_assert(sizeof(PackedQ4_1) == kPackCols * sizeof(BlockQ4_1));

// u[g][c] = column c's elements 4g .. 4g + 3 as u = q + 128 (the unsigned vpdpbusd operand).
struct PackedQ8_0 {
  uint16_t d[kPackCols];  // f16 scales
  uint8_t u[8][kPackCols][4];
};
static_assert(sizeof(PackedQ8_0) == kPackCols * sizeof(BlockQ8_0));

// One 256-element super-block of 16 columns (8 blocks of 32).
struct PackedQ4_K {
  uint32_t dm[kPackCols];          // column c's first 4 bytes: d | dmin << 16 (f16 each)
  uint32_t sc[3][kPackCols];       // sc[q][c]: column c's scales[4q .. 4q + 3] (6-bit table)
  uint8_t qs[4][8][kPackCols][4];  // qs[i][k][c]: column c's qs[32i + 4k .. + 3]: low nibbles
                                   // are block 2i's group k, high nibbles block 2i + 1's
};
static_assert(sizeof(PackedQ4_K) == kPackCols * sizeof(BlockQ4_K));

struct PackedQ6_K {
  uint8_t ql[2][16][kPackCols][4];  // ql[h][m][c]: column c's ql[64h + 4m .. + 3]
  uint8_t qh[2][8][kPackCols][4];   // qh[h][g][c]: column c's qh[32h + 4g .. + 3]
  uint32_t sc[4][kPackCols];        // sc[q][c]: column c's int8 scales[4q .. 4q + 3]
  uint16_t d[kPackCols];            // f16 super-block scales
};
static_assert(sizeof(PackedQ6_K) == kPackCols * sizeof(BlockQ6_K));

// Float weights (f32, f16, bf16 bits): element k of 16 columns side by side, one "block" per element, so
// a column group is [n_in][16] values: the GEMM's panel as it is, read without packing per call.
template <typename T>
struct PackedFloat {
  T v[kPackCols];
};

// Writes column groups [group_begin, group_end) of the packed layout of w (the file's rows,
// n_out rows of n_in elements) into out (the whole packed tensor).
using WeightPackFn = void (*)(const void* w, int64_t n_in, int64_t n_out, void* out, int64_t group_begin,
                              int64_t group_end);

// The packer of a type, or nullptr for types without a packed layout.
WeightPackFn weight_packer(DType type);

// Bytes of the packed layout of an {n_in, n_out} tensor.
inline int64_t packed_weight_bytes(DType type, int64_t n_in, int64_t n_out) {
  return (n_out + kPackCols - 1) / kPackCols * kPackCols * row_bytes(type, n_in);
}

}  // namespace ember::cpu
