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
  // AMX also needs Linux to grant the process its tile data state (see cpu_features.cpp).
  bool amx_tile = false;
  bool amx_int8 = false;
  // aarch64
  bool neon = false;
  bool dotprod = false;
};

// Kernel families. Each architecture has a chain of levels, each needing everything the one
// before it needs: x86: scalar < avx2 (AVX2+FMA+F16C) < avx512 (that plus AVX-512 F/BW/VL/DQ and
// VNNI) < amx (that plus AMX-TILE and AMX-INT8); aarch64: scalar < neon (ASIMD + dotprod,
// armv8.2-a). The enum's numeric order means nothing across architectures: compare levels only
// with isa_within().
enum class IsaLevel { scalar = 0, avx2 = 1, avx512 = 2, neon = 3, amx = 4 };

// Every level, for loops over them.
inline constexpr IsaLevel kIsaLevels[] = {IsaLevel::scalar, IsaLevel::avx2, IsaLevel::avx512, IsaLevel::amx,
                                          IsaLevel::neon};

// True if `level` is `cap` or below it on cap's chain (scalar is below every level): a CPU that
// runs cap's kernels runs level's too.
bool isa_within(IsaLevel level, IsaLevel cap);

// Detected once (the first call) and immutable after.
const CpuFeatures& cpu_features();

// The best level this CPU supports.
IsaLevel best_isa_level();

// The level kernels run at: best_isa_level() capped by the environment variable
// EMBER_CPU_ISA=scalar|avx2|avx512|amx|neon (a cap the CPU cannot run is ignored), so tests can
// exercise every variant on one machine. Read once.
IsaLevel active_isa_level();

// True if kernels of `level` may run on this CPU.
bool isa_supported(IsaLevel level);

const char* isa_name(IsaLevel level);

}  // namespace ember::cpu
