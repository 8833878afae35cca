// cpu/isa_registry.cpp: the one place that knows which ISA kernel tables this build compiled (the
// matmul tables of matmul_kernels.h, the op tables of op_kernels.h); CMake decides which ISA files
// exist, cpu_features which of them may run.
#include "cpu/matmul_kernels.h"
#include "cpu/op_kernels.h"

namespace ember::cpu {

const IsaKernels* isa_kernels(IsaLevel level) {
  switch (level) {
    case IsaLevel::scalar: return &isa_kernels_scalar();
#if EMBER_HAS_X86
    case IsaLevel::avx2: return &isa_kernels_avx2();
    case IsaLevel::avx512: return &isa_kernels_avx512();
#endif
#if EMBER_HAS_AMX
    case IsaLevel::amx: return &isa_kernels_amx();
#endif
#if EMBER_HAS_ARM
    case IsaLevel::neon: return &isa_kernels_neon();
#endif
    default: return nullptr;
  }
}

const OpKernels* op_kernels(IsaLevel level) {
  switch (level) {
    case IsaLevel::scalar: return &op_kernels_scalar();
#if EMBER_HAS_X86
    case IsaLevel::avx2: return &op_kernels_avx2();
    case IsaLevel::avx512: return &op_kernels_avx512();
#endif
#if EMBER_HAS_AMX
    case IsaLevel::amx: return &op_kernels_avx512();  // AMX adds matmul kernels only
#endif
#if EMBER_HAS_ARM
    case IsaLevel::neon: return &op_kernels_scalar();  // no NEON op kernels yet
#endif
    default: return nullptr;
  }
}

}  // namespace ember::cpu
