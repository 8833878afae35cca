// cpu/gemm.h: the per-ISA GEMM kernels (prefill-shaped matmuls), looked up by weight type when
// each ISA's kernel table is built. Declarations only, safe to include from baseline code.
#pragma once

#include <cstdint>

#include "cpu/matmul_kernels.h"
#include "cpu/weight_pack.h"

namespace ember::cpu {

// Columns per packed panel (one SIMD register of f32 outputs).
inline constexpr int64_t kGemmColsAvx2 = 8;
inline constexpr int64_t kGemmColsAvx512 = 16;

// nullptr where the ISA has no GEMM for the type.
GemmFn gemm_kernel_avx2(DType type);
GemmFn gemm_kernel_avx512(DType type);
GemmFn gemm_kernel_amx(DType type);
GemmFn gemm_kernel_neon(DType type);  // packed types only (q4_0, q4_1, q8_0, q4_k, q6_k), any row count

// The packer of the layout the avx512 (and amx) GEMMs read a type's weights in (weight_pack.h),
// nullptr where they read the file's rows.
WeightPackFn gemm_weight_packer_avx512(DType type);
WeightPackFn gemm_weight_packer_avx2(DType type);  // these types' GEMMs also take 1..3 rows
// Whether the avx2 GEMM of a type sums whole K-quant super-blocks in integers (tile_k), so that
// its activations must share one scale per super-block (ActFormat::q8a_k).
bool gemm_sums_super_blocks_avx2(DType type);

// The avx2 signed types' GEMMs (gemm_act_tiled_avx2) read their activations as int16 tiles.
ActTiling act_tiling_avx2();
bool gemm_act_tiled_avx2(DType type);

// The avx512 float GEMMs (f32, f16, bf16 weights) read their activations in these tiles.
ActTiling float_tiling_avx512();

// Bytes of panel scratch one thread needs for rows of n_in weights.
int64_t panel_bytes_avx2(int64_t n_in);
int64_t panel_bytes_avx512(int64_t n_in);

}  // namespace ember::cpu
