// errors.cpp: maps the core's exception types to Python classes, keeping the message intact.
#include <nanobind/nanobind.h>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/request.h"

namespace nb = nanobind;

void init_errors(nb::module_& m) {
  // Order matters: nanobind tries the most recently registered translator first, so the base
  // class goes first and the specific ones after it.
  // Every class also derives from EmberError, so `except ember.EmberError` (the CLI's one-line
  // error path) catches them all, while `except ValueError` still catches a bad argument.
  nb::exception<ember::Error> base(m, "EmberError", PyExc_RuntimeError);
  const auto both = [&](PyObject* builtin) { return nb::make_tuple(base, nb::handle(builtin)); };
  nb::exception<ember::InvalidArgument> invalid(m, "InvalidArgument", both(PyExc_ValueError));
  nb::exception<ember::Unsupported>(m, "UnsupportedError", both(PyExc_NotImplementedError));
  nb::exception<ember::FormatError>(m, "GGUFError", both(PyExc_ValueError));
  nb::exception<ember::EngineBusy>(m, "EngineBusy", base);
  // A request that can never run (the server answers 400), and of those a prompt over the
  // context, which carries its numbers as attributes.
  nb::exception<ember::InvalidRequest> invalid_request(m, "InvalidRequest", invalid);
  nb::exception<ember::PromptTooLong> too_long(m, "PromptTooLong", invalid_request);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {  // type: the class, which the module keeps
        try {
          std::rethrow_exception(p);
        } catch (const ember::PromptTooLong& e) {
          nb::object err = nb::handle(static_cast<PyObject*>(type))(e.what());
          err.attr("n_prompt_tokens") = e.n_prompt_tokens;
          err.attr("n_ctx") = e.n_ctx;
          PyErr_SetObject(static_cast<PyObject*>(type), err.ptr());
        }
      },
      too_long.ptr());
}
