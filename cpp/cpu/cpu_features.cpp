// cpu/cpu_features.cpp: run-time CPU detection (cpuid + xgetbv on x86, getauxval on aarch64).
// Compiled for the baseline ISA: nothing here may execute an instruction the CPU might lack.
#include "cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if EMBER_HAS_X86
#include <cpuid.h>
#endif
#if EMBER_HAS_ARM && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace ember::cpu {
namespace {

#if EMBER_HAS_X86
struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

// XCR0: which register states the OS saves on context switch. Without OS support the
// instructions fault even when cpuid lists them.
unsigned long long read_xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

CpuFeatures detect() {
  CpuFeatures f;
  const unsigned max_leaf = cpuid(0, 0).eax;
  const CpuidRegs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  if (!osxsave) return f;
  const unsigned long long xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!os_avx) return f;
  f.fma = bit(l1.ecx, 12);
  f.f16c = bit(l1.ecx, 29);
  if (max_leaf < 7) return f;
  const CpuidRegs l7 = cpuid(7, 0);
  const CpuidRegs l7s1 = cpuid(7, 1);
  f.avx2 = bit(l7.ebx, 5);
  f.avx_vnni = bit(l7s1.eax, 4);
  if (os_avx512) {
    f.avx512f = bit(l7.ebx, 16);
    f.avx512dq = bit(l7.ebx, 17);
    f.avx512bw = bit(l7.ebx, 30);
    f.avx512vl = bit(l7.ebx, 31);
    f.avx512_vnni = bit(l7.ecx, 11);
    f.avx512_bf16 = bit(l7s1.eax, 5);
  }
  return f;
}
#elif EMBER_HAS_ARM
CpuFeatures detect() {
  CpuFeatures f;
  f.neon = true;  // ASIMD is mandatory on aarch64
#if defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  constexpr unsigned long kHwcapAsimddp = 1ul << 20;  // HWCAP_ASIMDDP
  f.dotprod = (hwcap & kHwcapAsimddp) != 0;
#elif defined(__APPLE__)
  f.dotprod = true;  // every Apple arm64 CPU has it
#endif
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

IsaLevel detect_best_level() {
  const CpuFeatures& f = cpu_features();
  if (f.neon && f.dotprod) return IsaLevel::neon;
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni) {
    return IsaLevel::avx512;
  }
  if (avx2) return IsaLevel::avx2;
  return IsaLevel::scalar;
}

IsaLevel detect_active_level() {
  const IsaLevel best = best_isa_level();
  const char* cap = std::getenv("EMBER_CPU_ISA");
  if (cap == nullptr || *cap == '\0') return best;
  for (IsaLevel level : {IsaLevel::scalar, IsaLevel::avx2, IsaLevel::avx512, IsaLevel::neon}) {
    if (std::strcmp(cap, isa_name(level)) == 0) {
      // A cap only lowers the level; asking for an ISA the CPU lacks keeps the best one.
      return isa_supported(level) ? level : best;
    }
  }
  return best;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

IsaLevel best_isa_level() {
  static const IsaLevel level = detect_best_level();
  return level;
}

IsaLevel active_isa_level() {
  static const IsaLevel level = detect_active_level();
  return level;
}

bool isa_supported(IsaLevel level) {
  const IsaLevel best = best_isa_level();
  switch (level) {
    case IsaLevel::scalar: return true;
    case IsaLevel::neon: return best == IsaLevel::neon;
    case IsaLevel::avx2: return best == IsaLevel::avx2 || best == IsaLevel::avx512;
    case IsaLevel::avx512: return best == IsaLevel::avx512;
  }
  return false;
}

const char* isa_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::scalar: return "scalar";
    case IsaLevel::avx2: return "avx2";
    case IsaLevel::avx512: return "avx512";
    case IsaLevel::neon: return "neon";
  }
  return "?";
}

}  // namespace ember::cpu
