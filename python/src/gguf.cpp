// gguf.cpp: bindings for cpp/gguf — ember.GGUFFile. Tensor bytes go to numpy as read-only views
// of the mmap; each view holds a reference to the file so the mapping outlives it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf_values.h"

namespace nb = nanobind;
using ember::GGUFFile;
using ember::GGUFTensorInfo;
using ember::GGUFType;
using ember::GGUFValue;

namespace {

nb::object string_to_python(std::string_view s) {
  // Metadata strings are UTF-8 by the spec; a broken one is shown with U+FFFD, not an exception.
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

nb::object numeric_elem(const GGUFValue& v, uint64_t k) {
  auto load = [&](auto tag) {
    decltype(tag) x;
    std::memcpy(&x, v.elems + k * sizeof(x), sizeof(x));
    return x;
  };
  switch (v.elem_type) {
    case GGUFType::u8: return nb::int_(load(uint8_t{}));
    case GGUFType::i8: return nb::int_(load(int8_t{}));
    case GGUFType::u16: return nb::int_(load(uint16_t{}));
    case GGUFType::i16: return nb::int_(load(int16_t{}));
    case GGUFType::u32: return nb::int_(load(uint32_t{}));
    case GGUFType::i32: return nb::int_(load(int32_t{}));
    case GGUFType::u64: return nb::int_(load(uint64_t{}));
    case GGUFType::i64: return nb::int_(load(int64_t{}));
    case GGUFType::f32: return nb::float_(load(float{}));
    case GGUFType::f64: return nb::float_(load(double{}));
    case GGUFType::boolean: return nb::bool_(load(uint8_t{}) != 0);
    default: return nb::none();
  }
}

const GGUFTensorInfo& tensor_or_throw(const GGUFFile& f, const std::string& name) {
  const GGUFTensorInfo* t = f.find_tensor(name);
  if (t == nullptr) {
    throw nb::key_error(ember::cat("[gguf] ", f.path(), ": no tensor named '", name, "'").c_str());
  }
  return *t;
}

// numpy shape of a tensor: ggml lists the fastest dimension first, numpy last.
std::vector<size_t> numpy_shape(const GGUFTensorInfo& t) {
  return std::vector<size_t>(t.shape.rbegin(), t.shape.rend());
}

}  // namespace

nb::object gguf_value_to_python(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::u8:
    case GGUFType::u16:
    case GGUFType::u32:
    case GGUFType::u64: return nb::int_(v.u);
    case GGUFType::i8:
    case GGUFType::i16:
    case GGUFType::i32:
    case GGUFType::i64: return nb::int_(v.i);
    case GGUFType::f32:
    case GGUFType::f64: return nb::float_(v.f);
    case GGUFType::boolean: return nb::bool_(v.u != 0);
    case GGUFType::string: return string_to_python(v.str);
    case GGUFType::array: {
      nb::list out;
      if (v.elem_type == GGUFType::string) {
        for (std::string_view s : v.strings) out.append(string_to_python(s));
      } else if (v.elem_type == GGUFType::array) {
        for (const GGUFValue& item : v.items) out.append(gguf_value_to_python(item));
      } else {
        for (uint64_t k = 0; k < v.n_elems; ++k) out.append(numeric_elem(v, k));
      }
      return out;
    }
  }
  return nb::none();
}

void init_gguf(nb::module_& m) {
  nb::class_<GGUFTensorInfo>(m, "TensorInfo", "One entry of a GGUF file's tensor directory.")
      .def_ro("name", &GGUFTensorInfo::name)
      .def_prop_ro(
          "type", [](const GGUFTensorInfo& t) { return std::string(ember::dtype_name(t.type)); },
          "element type name, e.g. 'q4_k'")
      .def_prop_ro(
          "shape", [](const GGUFTensorInfo& t) { return nb::tuple(nb::cast(numpy_shape(t))); },
          "shape in numpy order (slowest dimension first)")
      .def_ro("n_elements", &GGUFTensorInfo::n_elements)
      .def_ro("offset", &GGUFTensorInfo::offset, "byte offset from the start of its shard's data section")
      .def_ro("file_offset", &GGUFTensorInfo::file_offset, "byte offset from the start of its shard's file")
      .def_ro("shard", &GGUFTensorInfo::shard, "the file of a split model that holds it (0: the first)")
      .def_ro("n_bytes", &GGUFTensorInfo::n_bytes)
      .def("__repr__", [](const GGUFTensorInfo& t) {
        std::string shape;
        for (size_t d : numpy_shape(t)) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        if (t.shape.size() == 1) shape += ",";
        return ember::cat("TensorInfo('", t.name, "', ", ember::dtype_name(t.type), ", (", shape, "))");
      });

  nb::class_<GGUFFile>(m, "GGUFFile", "A GGUF file mapped read-only; tensor data is never copied.")
      .def(nb::new_([](const std::string& path) {
             std::shared_ptr<GGUFFile> f;
             {
               nb::gil_scoped_release release;
               f = GGUFFile::open(path);
             }
             return f;
           }),
           nb::arg("path"))
      .def_prop_ro("path", &GGUFFile::path)
      .def_prop_ro("version", &GGUFFile::version)
      .def_prop_ro("alignment", &GGUFFile::alignment)
      .def_prop_ro("data_offset", &GGUFFile::data_offset)
      .def_prop_ro("file_bytes", &GGUFFile::file_bytes,
                   "bytes of all its files (all shards of a split model)")
      .def_prop_ro("shard_paths", &GGUFFile::shard_paths, "its files: [path] unless the model is split")
      .def_prop_ro(
          "metadata",
          [](const GGUFFile& f) {
            nb::dict out;
            for (const auto& [key, value] : f.metadata()) out[key.c_str()] = gguf_value_to_python(value);
            return out;
          },
          "metadata as a dict of Python values, in file order")
      .def_prop_ro(
          "tensors", [](const GGUFFile& f) { return f.tensors(); }, nb::rv_policy::copy)
      .def(
          "raw",
          [](std::shared_ptr<GGUFFile> f, const std::string& name) {
            const GGUFTensorInfo& t = tensor_or_throw(*f, name);
            // The capsule owns a reference to the file, keeping the mapping alive for the view.
            auto* keep = new std::shared_ptr<GGUFFile>(f);
            nb::capsule owner(keep,
                              [](void* p) noexcept { delete static_cast<std::shared_ptr<GGUFFile>*>(p); });
            size_t shape[1] = {static_cast<size_t>(t.n_bytes)};
            return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(t.data, 1, shape, owner);
          },
          nb::arg("name"), "the tensor's bytes as a read-only uint8 numpy view of the file")
      .def(
          "dequantize",
          [](const GGUFFile& f, const std::string& name) {
            const GGUFTensorInfo& t = tensor_or_throw(f, name);
            const ember::TypeTraits& traits = ember::type_traits(t.type);
            if (traits.dequantize_row == nullptr) {
              throw ember::Unsupported(ember::cat("[gguf] ", f.path(), ": tensor '", name,
                                                  "': cannot dequantize type ", traits.name));
            }
            auto* values = new float[t.n_elements];
            nb::capsule owner(values, [](void* p) noexcept { delete[] static_cast<float*>(p); });
            {
              nb::gil_scoped_release release;
              traits.dequantize_row(t.data, values, t.n_elements);
            }
            std::vector<size_t> shape = numpy_shape(t);
            return nb::ndarray<nb::numpy, float>(values, shape.size(), shape.data(), owner);
          },
          nb::arg("name"), "the tensor's values as a float32 numpy array")
      .def(
          "get",
          [](const GGUFFile& f, const std::string& key, nb::object fallback) -> nb::object {
            for (const auto& [name, value] : f.metadata()) {
              if (name == key) return gguf_value_to_python(value);
            }
            return fallback;
          },
          nb::arg("key"), nb::arg("default") = nb::none(),
          "one metadata value (default when absent), without converting the others")
      .def("__repr__", [](const GGUFFile& f) {
        return ember::cat("GGUFFile('", f.path(), "', version=", f.version(),
                          ", tensors=", f.tensors().size(), ", metadata=", f.metadata().size(), ")");
      });
}
