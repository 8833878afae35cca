// cpu/cpu_features.cpp: run-time CPU detection (cpuid + xgetbv on x86, getauxval on aarch64).
// Compiled for the baseline ISA: nothing here may execute an instruction the CPU might lack.
#include "cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if EMBER_HAS_X86
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
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

// Linux enables AMX tile data (XSTATE component 18) in XCR0 but traps its first use unless the
// process asked for it: the state is 8 KB, so the kernel allocates it (and checks sigaltstack
// sizes) only on request. The permission is process-wide, covers threads started before it, and
// is asked for once, here. Elsewhere: no AMX (no other OS is known to allow it).
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
  constexpr long kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  const unsigned max_leaf = cpuid(0, 0).eax;
  const CpuidRegs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  if (!osxsave) return f;
  const unsigned long long xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                 // XMM and YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;         // XTILECFG, XTILEDATA
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
  if (os_amx && bit(l7.edx, 24) && bit(l7.edx, 25) && request_amx_permission()) {
    f.amx_tile = true;  // AMX-TILE: cpuid 7.0 edx bit 24
    f.amx_int8 = true;  // AMX-INT8: bit 25
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
    // amx only where this build compiled its kernels (the compiler may lack -mamx-*).
    if (EMBER_HAS_AMX && f.amx_tile && f.amx_int8) return IsaLevel::amx;
    return IsaLevel::avx512;
  }
  if (avx2) return IsaLevel::avx2;
  return IsaLevel::scalar;
}

IsaLevel detect_active_level() {
  const IsaLevel best = best_isa_level();
  const char* cap = std::getenv("EMBER_CPU_ISA");
  if (cap == nullptr || *cap == '\0') return best;
  for (IsaLevel level : kIsaLevels) {
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

bool isa_within(IsaLevel level, IsaLevel cap) {
  // Position on the level's own chain; scalar heads both.
  auto rank = [](IsaLevel l) {
    switch (l) {
      case IsaLevel::scalar: return 0;
      case IsaLevel::avx2: return 1;
      case IsaLevel::avx512: return 2;
      case IsaLevel::amx: return 3;
      case IsaLevel::neon: return 1;
    }
    return 0;
  };
  auto is_arm = [](IsaLevel l) { return l == IsaLevel::neon; };
  if (level == IsaLevel::scalar) return true;
  if (cap == IsaLevel::scalar || is_arm(level) != is_arm(cap)) return false;
  return rank(level) <= rank(cap);
}

bool isa_supported(IsaLevel level) { return isa_within(level, best_isa_level()); }

const char* isa_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::scalar: return "scalar";
    case IsaLevel::avx2: return "avx2";
    case IsaLevel::avx512: return "avx512";
    case IsaLevel::amx: return "amx";
    case IsaLevel::neon: return "neon";
  }
  return "?";
}

}  // namespace ember::cpu
