// cpu/x86/op_kernels_x86.cpp: the avx2 and avx512 op tables (op_kernels.h). Only their addresses
// are taken here, so this file needs no ISA flags; the kernels themselves are in the *_avx2 and
// *_avx512 files. The AVX-512 level keeps the AVX2 store and element-wise kernels
// and attends two queries per instruction (the AVX2 kernel's bits).
#include "cpu/op_kernels.h"

namespace ember::cpu {

namespace {
constexpr OpKernels kAvx2Ops = {
    IsaLevel::avx2, 8, attention_block_avx2, f32_to_f16_row_avx2, quantize_row_q8_0_avx2, silu_mul_avx2};
constexpr OpKernels kAvx512Ops = {
    IsaLevel::avx512, 8, attention_block_avx512, f32_to_f16_row_avx2, quantize_row_q8_0_avx2, silu_mul_avx2};
}  // namespace

const OpKernels& op_kernels_avx2() { return kAvx2Ops; }
const OpKernels& op_kernels_avx512() { return kAvx512Ops; }

}  // namespace ember::cpu
