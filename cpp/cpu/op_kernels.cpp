// cpu/op_kernels.cpp: the scalar op table (portable C++, on every CPU) and the choice of the
// active one; the SIMD tables are x86/op_kernels_x86.cpp's, the registry isa_registry.cpp.
#include "cpu/op_kernels.h"

#include "quant/quant.h"

namespace ember::cpu {

namespace {
constexpr OpKernels kScalarOps = {
    IsaLevel::scalar, 1, attention_block_scalar, f32_to_f16_row_scalar, quantize_row_q8_0, silu_mul_scalar};
}  // namespace

const OpKernels& op_kernels_scalar() { return kScalarOps; }

const OpKernels& OpKernels::for_rows(int64_t n) const {
  return n % row_multiple == 0 ? *this : op_kernels_scalar();
}

const OpKernels& active_op_kernels() {
  // The level the matmul kernels run at (EMBER_CPU_ISA caps it for tests).
  const OpKernels* kernels = op_kernels(active_isa_level());
  return kernels ? *kernels : op_kernels_scalar();
}

}  // namespace ember::cpu
