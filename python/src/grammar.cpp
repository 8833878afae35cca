// grammar.cpp: bindings for sampling/llguidance.h and sampling/constraint.h —
// ember._core.GrammarCompiler, Grammar (a compiled grammar, passed to Engine.submit and
// Sampler) and GrammarState (one walk through a grammar, for tests and benchmarks).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <string>

#include "sampling/constraint.h"
#include "sampling/llguidance.h"
#include "tokenizer/tokenizer.h"

namespace nb = nanobind;
using ember::Grammar;
using ember::GrammarCompiler;
using ember::TokenConstraint;

void init_grammar(nb::module_& m) {
  nb::class_<Grammar>(m, "Grammar",
                      "A compiled grammar for one vocabulary (immutable, shared by the requests that use "
                      "it); from GrammarCompiler.compile.")
      .def_prop_ro("n_vocab", &Grammar::n_vocab)
      .def("start", &Grammar::start, "A fresh GrammarState at the grammar's start.");

  nb::class_<TokenConstraint>(m, "GrammarState", "One request's position in a grammar.")
      .def(
          "mask",
          [](TokenConstraint& c, int32_t n_vocab) {
            const size_t n_words = ember::mask_words(n_vocab);
            auto* words = new uint32_t[n_words]();
            {
              nb::gil_scoped_release release;
              c.fill_mask(words);
            }
            nb::capsule owner(words, [](void* p) noexcept { delete[] static_cast<uint32_t*>(p); });
            return nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>(words, {n_words}, owner);
          },
          nb::arg("n_vocab"),
          "uint32 [ceil(n_vocab / 32)]: bit id % 32 of word id // 32 is set when token id may come next")
      .def("advance", &TokenConstraint::advance, nb::arg("token"),
           "Moves past `token`; False (see error) when the grammar rejects it.")
      .def_prop_ro("is_accepting", &TokenConstraint::is_accepting,
                   "The tokens so far form a complete sentence of the grammar.")
      .def_prop_ro("error", &TokenConstraint::error);

  nb::class_<GrammarCompiler>(m, "GrammarCompiler",
                              "Compiles JSON Schemas, Lark grammars and regexes for one vocabulary with "
                              "llguidance (opened from the shared library at `llguidance_path`), caching "
                              "the last `cache_size` grammars. Thread-safe.")
      .def(
          "__init__",
          [](GrammarCompiler* self, const std::string& llguidance_path,
             std::shared_ptr<const ember::Tokenizer> tokenizer, size_t cache_size) {
            nb::gil_scoped_release release;
            new (self) GrammarCompiler(ember::Llguidance::open(llguidance_path), *tokenizer, cache_size);
          },
          nb::arg("llguidance_path"), nb::arg("tokenizer"), nb::arg("cache_size") = 64)
      .def(
          "compile",
          [](GrammarCompiler& c, const std::string& kind, const std::string& data) {
            nb::gil_scoped_release release;
            return std::const_pointer_cast<Grammar>(c.compile(kind, data));
          },
          nb::arg("kind"), nb::arg("data"),
          "kind 'json_schema' (data: JSON text), 'lark' or 'regex'. Raises ValueError with "
          "llguidance's message for a grammar it rejects.")
      .def_prop_ro("n_vocab", &GrammarCompiler::n_vocab)
      .def_prop_ro("n_compiled", &GrammarCompiler::n_compiled, "Compilations done (cache misses).");
}
