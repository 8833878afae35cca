// embedder.cpp: bindings for cpp/model/embedder.h — ember._core.Embedder, a model's (an encoder's
// or a decoder's) embeddings of token sequences. Embeddings go to numpy without copies; the GIL is released
// around loading and embedding.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "load_model.h"
#include "model/embedder.h"

namespace nb = nanobind;

namespace {

using Embeddings = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

constexpr std::pair<ember::Pooling, const char*> kPoolingNames[] = {{ember::Pooling::none, "none"},
                                                                    {ember::Pooling::mean, "mean"},
                                                                    {ember::Pooling::cls, "cls"},
                                                                    {ember::Pooling::last, "last"},
                                                                    {ember::Pooling::rank, "rank"}};

const char* pooling_name(ember::Pooling p) {
  for (const auto& [pooling, name] : kPoolingNames) {
    if (pooling == p) return name;
  }
  return "none";
}

ember::Pooling pooling_of(const std::string& name) {
  for (const auto& [pooling, known] : kPoolingNames) {
    if (name == known) return pooling;
  }
  throw ember::InvalidArgument(
      ember::cat("[embed] pooling '", name, "' is not one of none, mean, cls, last, rank"));
}

struct PyEmbedder {
  std::shared_ptr<ember::Model> model;
  std::unique_ptr<ember::Embedder> embedder;

  PyEmbedder(const std::string& path, std::optional<int> n_threads, std::optional<int64_t> n_batch,
             const std::string& device, const std::optional<std::string>& pooling) {
    ember::EmbedderOptions options;
    if (n_batch) options.n_batch = *n_batch;
    if (pooling) options.pooling = pooling_of(*pooling);
    nb::gil_scoped_release release;
    model = load_model(path, n_threads, device);
    embedder = std::make_unique<ember::Embedder>(model, options);
  }
};

std::vector<std::vector<int32_t>> to_int32(const std::vector<std::vector<int64_t>>& lists, const char* what) {
  std::vector<std::vector<int32_t>> out(lists.size());
  for (size_t i = 0; i < lists.size(); ++i) {
    for (int64_t id : lists[i]) {
      if (id < INT32_MIN || id > INT32_MAX)
        throw ember::InvalidArgument(
            ember::cat("[embed] input ", i, " has ", what, " ", id, ", out of range"));
      out[i].push_back(static_cast<int32_t>(id));
    }
  }
  return out;
}

Embeddings embed(PyEmbedder& self, const std::vector<std::vector<int64_t>>& inputs, bool normalize,
                 const std::optional<std::vector<std::vector<int64_t>>>& token_types) {
  const std::vector<std::vector<int32_t>> tokens = to_int32(inputs, "token id");
  std::vector<std::vector<int32_t>> types;
  if (token_types) types = to_int32(*token_types, "token type");
  std::vector<std::span<const int32_t>> seqs(tokens.begin(), tokens.end());
  std::vector<std::span<const int32_t>> type_spans(types.begin(), types.end());
  const size_t n_embd = static_cast<size_t>(self.embedder->n_embd());
  const size_t n_out = static_cast<size_t>(self.embedder->n_out_rows(seqs));
  float* data = new float[std::max<size_t>(n_out * n_embd, 1)];
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  {
    nb::gil_scoped_release release;
    self.embedder->embed(seqs, normalize, data, type_spans);
  }
  return Embeddings(data, {n_out, n_embd}, owner);
}

}  // namespace

void init_embedder(nb::module_& m) {
  nb::class_<PyEmbedder>(m, "Embedder", "A model (an encoder or a decoder) loaded for embeddings.")
      .def(nb::init<const std::string&, std::optional<int>, std::optional<int64_t>, const std::string&,
                    const std::optional<std::string>&>(),
           nb::arg("path"), nb::arg("n_threads") = nb::none(), nb::arg("n_batch") = nb::none(),
           nb::arg("device") = "cpu", nb::arg("pooling") = nb::none(),
           "Loads a GGUF model on `device` (a backend that lacks an encoder's ops is refused) for "
           "embeddings. n_threads defaults to the physical cores, n_batch (token rows per forward pass, "
           "sequences packed whole) to 2048; pooling (none, mean, cls, last, rank) overrides the file's.")
      .def("embed", &embed, nb::arg("inputs"), nb::arg("normalize") = true,
           nb::arg("token_types") = nb::none(),
           "Embeddings [len(inputs), n_embd] float32 of token sequences, pooled as `pooling` says and "
           "L2-normalised unless normalize=False (pooling none: one row per token, inputs one after "
           "another); token_types: each input's segment ids (a text pair's second text 1), all 0 when "
           "None.")
      .def_prop_ro(
          "n_token_types",
          [](const PyEmbedder& self) { return std::max<int64_t>(self.model->config().n_token_types, 1); })
      .def_prop_ro(
          "device", [](const PyEmbedder& self) { return self.model->backend().device_name(); },
          "The device the model runs on.")
      .def_prop_ro("n_embd", [](const PyEmbedder& self) { return self.embedder->n_embd(); })
      .def_prop_ro("max_tokens", [](const PyEmbedder& self) { return self.embedder->max_tokens(); })
      .def_prop_ro("n_batch", [](const PyEmbedder& self) { return self.embedder->n_batch(); })
      .def_prop_ro("pooling", [](const PyEmbedder& self) { return pooling_name(self.embedder->pooling()); })
      .def_prop_ro("is_encoder", [](const PyEmbedder& self) { return self.model->config().is_encoder(); })
      .def_prop_ro("architecture",
                   [](const PyEmbedder& self) { return std::string(self.model->config().arch->name); });
}
