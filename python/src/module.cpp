// module.cpp: the ember._core entry point. Only calls one init_x per binding file.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

void init_errors(nb::module_& m);
void init_gguf(nb::module_& m);
void init_quant(nb::module_& m);
void init_tokenizer(nb::module_& m);
void init_model(nb::module_& m);
void init_embedder(nb::module_& m);
void init_grammar(nb::module_& m);
void init_sampling(nb::module_& m);
void init_engine(nb::module_& m);
void init_cpu(nb::module_& m);
void init_devices(nb::module_& m);
void init_vision(nb::module_& m);

NB_MODULE(_core, m) {
  m.doc() = "ember's C++ core: GGUF files, quantization, tokenizers, models";
  init_errors(m);
  init_gguf(m);
  init_quant(m);
  init_tokenizer(m);
  init_model(m);
  init_embedder(m);
  init_grammar(m);
  init_sampling(m);
  init_engine(m);
  init_cpu(m);
  init_devices(m);
  init_vision(m);
}
