// quant.cpp: bindings for cpp/quant: whole-array dequantize / quantize by type name. Checks and
// threading live in quant/convert.h; this file converts arguments and results and releases the
// GIL around the work.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/convert.h"

namespace nb = nanobind;

namespace {

using RawBytes = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
// -> float32[n_elements]. The array comes from numpy's own allocator, which asks the kernel for
// huge pages on large buffers: first-touch page faults otherwise cost more than dequantizing.
nb::object dequantize_bytes(const std::string& type_name, const void* raw, int64_t raw_bytes,
                            int64_t n_elements) {
  const ember::TypeTraits& t = ember::dequantizable_type(type_name);
  (void)ember::quantized_size(t, n_elements);  // validate before allocating
  nb::object values = nb::module_::import_("numpy").attr("empty")(n_elements, "float32");
  float* dst = nb::cast<nb::ndarray<float, nb::c_contig, nb::device::cpu>>(values).data();
  {
    nb::gil_scoped_release no_gil;
    std::unique_ptr<ember::ThreadPool> pool = ember::make_convert_pool(n_elements);
    ember::dequantize(t, raw, raw_bytes, dst, n_elements, pool.get());
  }
  return values;
}

nb::bytes quantize_array(const FloatArray& array, const std::string& type_name) {
  const ember::TypeTraits& t = ember::quantizable_type(type_name);
  if (array.ndim() == 0) {
    throw ember::InvalidArgument(
        ember::cat("[quant] ", t.name, ": expected an array with at least one dimension, got a scalar"));
  }
  (void)ember::quantized_size(t,
                              static_cast<int64_t>(array.shape(array.ndim() - 1)));  // rows are whole blocks
  const int64_t n = static_cast<int64_t>(array.size());
  const int64_t n_bytes = ember::quantized_size(t, n);
  // The bytes object is filled in place: nobody else can see it until it is returned.
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n_bytes));
  if (out == nullptr) throw nb::python_error();
  nb::bytes result = nb::steal<nb::bytes>(out);
  char* dst = PyBytes_AS_STRING(out);
  {
    nb::gil_scoped_release no_gil;
    std::unique_ptr<ember::ThreadPool> pool = ember::make_convert_pool(n);
    ember::quantize(t, array.data(), n, dst, pool.get());
  }
  return result;
}

}  // namespace

void init_quant(nb::module_& m) {
  m.def(
      "dequantize",
      [](const std::string& type_name, const RawBytes& raw, int64_t n_elements) {
        return dequantize_bytes(type_name, raw.data(), static_cast<int64_t>(raw.nbytes()), n_elements);
      },
      nb::arg("type_name"), nb::arg("raw").noconvert(), nb::arg("n_elements"),
      "The first n_elements values stored in raw (uint8 array) as float32[n_elements].");
  m.def(
      "dequantize",
      [](const std::string& type_name, const nb::bytes& raw, int64_t n_elements) {
        return dequantize_bytes(type_name, raw.c_str(), static_cast<int64_t>(raw.size()), n_elements);
      },
      nb::arg("type_name"), nb::arg("raw"), nb::arg("n_elements"),
      "The first n_elements values stored in raw (bytes) as float32[n_elements].");
  m.def("quantize", &quantize_array, nb::arg("array"), nb::arg("type_name"),
        "float32 array (last dimension a multiple of the block size) -> the type's blocks, as bytes.");
}
