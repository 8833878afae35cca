// errors.cpp: maps the core's exception types to Python classes, keeping the message intact.
#include <nanobind/nanobind.h>

#include "core/error.h"

namespace nb = nanobind;

void init_errors(nb::module_& m) {
  // Order matters: nanobind tries the most recently registered translator first, so the base
  // class goes first and the specific ones after it.
  // Every class also derives from EmberError, so `except ember.EmberError` (the CLI's one-line
  // error path) catches them all, while `except ValueError` still catches a bad argument.
  nb::exception<ember::Error> base(m, "EmberError", PyExc_RuntimeError);
  const auto both = [&](PyObject* builtin) { return nb::make_tuple(base, nb::handle(builtin)); };
  nb::exception<ember::InvalidArgument>(m, "InvalidArgument", both(PyExc_ValueError));
  nb::exception<ember::Unsupported>(m, "UnsupportedError", both(PyExc_NotImplementedError));
  nb::exception<ember::FormatError>(m, "GGUFError", both(PyExc_ValueError));
}
