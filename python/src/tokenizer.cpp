// tokenizer.cpp: bindings for cpp/tokenizer (not written yet).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void init_tokenizer(nb::module_& m) {}
