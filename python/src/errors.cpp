// errors.cpp: maps the core's exception types to Python classes, keeping the message intact.
#include <nanobind/nanobind.h>

#include "core/error.h"

namespace nb = nanobind;

void init_errors(nb::module_& m) {
  // Order matters: nanobind tries the most recently registered translator first, so the base
  // class goes first and the specific ones after it.
  nb::exception<ember::Error>(m, "EmberError", PyExc_RuntimeError);
  nb::exception<ember::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  nb::exception<ember::Unsupported>(m, "UnsupportedError", PyExc_NotImplementedError);
  nb::exception<ember::FormatError>(m, "GGUFError", PyExc_ValueError);
}
