// cpu/cpu_features.h: what the CPU we run on can execute, detected once at run time, and the
// ISA level the kernels use. Every ISA-specific kernel is reached only through this check, so one
// binary runs on any CPU of its architecture.
#pragma once

namespace ember::cpu {

// Instruction-set extensions the kernels care about; all false on other architectures.
struct CpuFeatures {
  // x86: each flag is set only if the CPU has it AND the OS saves the register state (xgetbv).
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_vnni = false;
  bool avx_vnni = false;
  bool avx512_bf16 = false;
  // aarch64
  bool neon = false;
  bool dotprod = false;
};

// Kernel families, in increasing order of capability on each architecture. Each level's kernels
// need everything listed: avx2 = AVX2+FMA+F16C; avx512 = that plus AVX-512 F/BW/VL/DQ and VNNI;
// neon = ASIMD + dotprod (armv8.2-a).
enum class IsaLevel { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };

// Detected once (the first call) and immutable after.
const CpuFeatures& cpu_features();

// The best level this CPU supports.
IsaLevel best_isa_level();

// The level kernels run at: best_isa_level() capped by the environment variable
// EMBER_CPU_ISA=scalar|avx2|avx512|neon (a cap above what the CPU has is ignored), so tests can
// exercise every variant on one machine. Read once.
IsaLevel active_isa_level();

// True if kernels of `level` may run on this CPU.
bool isa_supported(IsaLevel level);

const char* isa_name(IsaLevel level);

}  // namespace ember::cpu
