// cpu/x86/gemm_avx2.h: how the AVX2 GEMM's files reach each other: the per-type GEMMs of the
// signed and float types (nullptr for other types) and their scratch, which gemm_avx2.cpp's table
// and panel size take in. Private to cpu/x86/.
#pragma once

#include <cstdint>

#include "cpu/matmul_kernels.h"
#include "quant/types.h"

namespace ember::cpu {

GemmFn gemm_signed_avx2(DType type);  // q8_0, iq4_nl (gemm_signed_avx2.cpp)
GemmFn gemm_float_avx2(DType type);   // f32, f16, bf16 (gemm_float_avx2.cpp)
// Bytes of panel scratch the signed types' GEMM needs for rows of n_in weights.
int64_t panel_bytes_signed_avx2(int64_t n_in);

}  // namespace ember::cpu
