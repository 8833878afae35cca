// quant.cpp: bindings for cpp/quant (not written yet).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void init_quant(nb::module_& m) {}
