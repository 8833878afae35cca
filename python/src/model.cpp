// model.cpp: bindings for cpp/model — ember._core.Model, a loaded model with one sequence's
// context. Logits go to numpy without copies: the forward pass writes straight into an array
// whose capsule owns the memory. The GIL is released around loading and evaluation.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf_values.h"
#include "load_model.h"
#include "model/context.h"
#include "model/model.h"

namespace nb = nanobind;

namespace {

using Logits2D = nb::ndarray<nb::numpy, float, nb::ndim<2>>;
using Logits1D = nb::ndarray<nb::numpy, float, nb::ndim<1>>;

// A model and the context of the one sequence Python evaluates on it.
struct PyModel {
  std::shared_ptr<ember::Model> model;
  std::unique_ptr<ember::Context> context;

  PyModel(const std::string& path, std::optional<int> n_threads, std::optional<int64_t> n_ctx,
          std::optional<int64_t> n_batch, const std::string& device) {
    nb::gil_scoped_release release;
    model = load_model(path, n_threads, device);
    ember::ContextOptions context_options;
    context_options.n_ctx = n_ctx.value_or(0);
    if (n_batch) context_options.n_batch = *n_batch;
    context = std::make_unique<ember::Context>(model, context_options);
  }

  int64_t n_vocab() const { return model->config().n_vocab; }
};

// Owned float storage for `n` values, freed when the returned capsule is.
float* new_owned_floats(size_t n, nb::capsule* owner) {
  float* data = new float[n];
  *owner = nb::capsule(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return data;
}

Logits2D eval(PyModel& self, const std::vector<int32_t>& tokens, bool reset) {
  const size_t n_tokens = tokens.size(), n_vocab = static_cast<size_t>(self.n_vocab());
  nb::capsule owner;
  float* logits = new_owned_floats(n_tokens * n_vocab, &owner);
  {
    nb::gil_scoped_release release;
    if (reset) self.context->reset();
    self.context->eval_all(tokens.data(), static_cast<int64_t>(n_tokens), logits);
  }
  return Logits2D(logits, {n_tokens, n_vocab}, owner);
}

Logits1D eval_last(PyModel& self, const std::vector<int32_t>& tokens, bool reset) {
  const size_t n_vocab = static_cast<size_t>(self.n_vocab());
  nb::capsule owner;
  float* logits = new_owned_floats(n_vocab, &owner);
  {
    nb::gil_scoped_release release;
    if (reset) self.context->reset();
    self.context->eval_last(tokens.data(), static_cast<int64_t>(tokens.size()), logits);
  }
  return Logits1D(logits, {n_vocab}, owner);
}

// Scalar and string metadata; arrays (the tokenizer's vocabulary, merges, ...) are left out —
// ember.GGUFFile reads those.
nb::dict metadata(const PyModel& self) {
  nb::dict out;
  for (const auto& [key, value] : self.model->file().metadata()) {
    if (value.type != ember::GGUFType::array) out[key.c_str()] = gguf_value_to_python(value);
  }
  return out;
}

}  // namespace

void init_model(nb::module_& m) {
  static const std::string doc = ember::cat(
      "Loads a GGUF model (weights are read from the file mapping; the CPU backend repacks the matmul "
      "weights of some types once, into a copy of the same size). n_threads defaults to the number of "
      "physical cores, n_ctx to min(context_length, ",
      ember::Context::kDefaultMaxCtx, "), n_batch (rows per forward pass; longer inputs are split) to ",
      ember::ContextOptions().n_batch, "; device: 'cpu', 'cuda[:N]', 'vulkan[:N]' or 'auto'.");
  nb::class_<PyModel>(m, "Model", "A GGUF model loaded for evaluation, with the KV cache of one sequence.")
      .def(nb::init<const std::string&, std::optional<int>, std::optional<int64_t>, std::optional<int64_t>,
                    const std::string&>(),
           nb::arg("path"), nb::arg("n_threads") = nb::none(), nb::arg("n_ctx") = nb::none(),
           nb::arg("n_batch") = nb::none(), nb::arg("device") = "auto", doc.c_str())
      .def_prop_ro(
          "device", [](const PyModel& self) { return self.model->backend().device_name(); },
          "The device the model runs on.")
      .def("eval", &eval, nb::arg("tokens"), nb::arg("reset") = true,
           "Runs tokens through the model and returns float32 logits [n_tokens, n_vocab], one row "
           "per token. reset=False continues after the tokens already in the cache.")
      .def("eval_last", &eval_last, nb::arg("tokens"), nb::arg("reset") = true,
           "Like eval, but computes and returns the logits of the last token only: [n_vocab].")
      .def(
          "reset", [](PyModel& self) { self.context->reset(); }, "Empties the KV cache.")
      .def_prop_ro("n_vocab", &PyModel::n_vocab)
      .def_prop_ro("n_embd", [](const PyModel& self) { return self.model->config().n_embd; })
      .def_prop_ro("n_layer", [](const PyModel& self) { return self.model->config().n_layer; })
      .def_prop_ro("n_ctx_train", [](const PyModel& self) { return self.model->config().n_ctx_train; })
      .def_prop_ro("n_ctx", [](const PyModel& self) { return self.context->n_ctx(); })
      .def_prop_ro("n_batch", [](const PyModel& self) { return self.context->n_batch(); })
      .def_prop_ro(
          "n_past", [](const PyModel& self) { return self.context->n_past(); },
          "Tokens currently in the KV cache.")
      .def_prop_ro("n_threads", [](const PyModel& self) { return self.model->backend().n_threads(); })
      .def_prop_ro("architecture",
                   [](const PyModel& self) { return std::string(self.model->config().arch->name); })
      .def_prop_ro("metadata", &metadata, "GGUF metadata: scalars and strings (arrays left out).");
}
