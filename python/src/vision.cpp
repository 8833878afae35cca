// vision.cpp: bindings for cpp/vision — ember._core.VisionModel, a vision projector (mmproj GGUF)
// on its own backend: its hyper-parameters (which ember.vision's preprocessing reads) and
// encode(). An engine with an mmproj loads its own on the engine's backend (EngineOptions::mmproj);
// this one serves tests and benchmarks. The GIL is released around loading and encoding.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "core/error.h"
#include "vision.h"
#include "vision/vision_model.h"

namespace nb = nanobind;

namespace {

using Pixels = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Embeddings = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

void init_vision_model(PyVisionModel* self, const std::string& path, const std::string& device,
                       std::optional<int> n_threads) {
  std::shared_ptr<ember::VisionModel> model;
  {
    nb::gil_scoped_release release;
    std::shared_ptr<ember::Backend> backend = ember::make_backend(device, n_threads.value_or(0));
    model = ember::VisionModel::load(path, std::move(backend));
  }
  new (self) PyVisionModel{std::move(model), false};
}

Embeddings encode(PyVisionModel& self, const Pixels& pixels) {
  if (self.engine_owned) {
    throw ember::InvalidArgument(
        "[vision] an engine's projector encodes on the engine's thread: submit the image");
  }
  if (pixels.shape(0) != 3) {
    throw ember::InvalidArgument(
        ember::cat("[vision] pixels must be float32 [3, height, width], got ", pixels.shape(0), " planes"));
  }
  const int64_t height = static_cast<int64_t>(pixels.shape(1)), width = static_cast<int64_t>(pixels.shape(2));
  const ember::VisionModel& m = *self.model;
  const size_t n_tokens = static_cast<size_t>(m.tower().n_tokens(width, height));
  const size_t n_embd = static_cast<size_t>(m.config().n_embd_out);
  std::vector<float> out;
  {
    nb::gil_scoped_release release;
    out = m.encode(pixels.data(), width, height);
  }
  float* data = new float[std::max<size_t>(out.size(), 1)];
  std::copy(out.begin(), out.end(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return Embeddings(data, {n_tokens, n_embd}, owner);
}

}  // namespace

void init_vision(nb::module_& m) {
  nb::class_<PyVisionModel>(
      m, "VisionModel", "A vision projector (an mmproj GGUF in llama.cpp's clip layout) on its own backend.")
      .def("__init__", &init_vision_model, nb::arg("path"), nb::arg("device") = "cpu",
           nb::arg("n_threads") = nb::none())
      .def_prop_ro("projector_type", [](const PyVisionModel& s) { return s.model->config().projector_type; })
      .def_prop_ro("image_size", [](const PyVisionModel& s) { return s.model->config().image_size; })
      .def_prop_ro("patch_size", [](const PyVisionModel& s) { return s.model->config().patch_size; })
      .def_prop_ro("spatial_merge_size",
                   [](const PyVisionModel& s) { return s.model->config().spatial_merge_size; })
      .def_prop_ro("image_mean", [](const PyVisionModel& s) { return s.model->config().image_mean; })
      .def_prop_ro("image_std", [](const PyVisionModel& s) { return s.model->config().image_std; })
      .def_prop_ro(
          "n_embd", [](const PyVisionModel& s) { return s.model->config().n_embd_out; },
          "Width of the embeddings: the language model's.")
      .def_prop_ro("device", [](const PyVisionModel& s) { return s.model->backend().device_name(); })
      .def(
          "preprocessed_size",
          [](const PyVisionModel& s, int64_t width, int64_t height) {
            return s.model->tower().preprocessed_size(width, height);
          },
          nb::arg("width"), nb::arg("height"), "(width, height) preprocessing resizes such an image to.")
      .def(
          "n_tokens",
          [](const PyVisionModel& s, int64_t width, int64_t height) {
            return s.model->tower().n_tokens(width, height);
          },
          nb::arg("width"), nb::arg("height"), "Image tokens of preprocessed pixels of that size.")
      .def("encode", &encode, nb::arg("pixels"),
           "Embeddings float32 [n_tokens, n_embd] of preprocessed pixels float32 [3, height, width].");
}
