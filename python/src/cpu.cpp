// cpu.cpp: what the CPU kernels run on, for reports such as `ember bench`.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "cpu/cpu_features.h"

namespace nb = nanobind;

void init_cpu(nb::module_& m) {
  m.def(
      "cpu_isa", [] { return std::string(ember::cpu::isa_name(ember::cpu::active_isa_level())); },
      "The instruction set the CPU kernels use (scalar, avx2, avx512, amx or neon): the best this "
      "CPU runs, capped by EMBER_CPU_ISA.");
}
