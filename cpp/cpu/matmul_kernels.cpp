// cpu/matmul_kernels.cpp: the one place that knows which ISA tables this build compiled.
#include "cpu/matmul_kernels.h"

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

}  // namespace ember::cpu
