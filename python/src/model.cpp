// model.cpp: bindings for cpp/model (not written yet).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void init_model(nb::module_& m) {}
