// devices.cpp: the devices this build's backends can run on, for `ember info --devices`.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "backend.h"

namespace nb = nanobind;

void init_devices(nb::module_& m) {
  m.def(
      "devices",
      [] {
        std::vector<std::string> notes;
        std::vector<ember::BackendDevice> devices;
        {
          nb::gil_scoped_release release;
          devices = ember::list_devices(&notes);
        }
        nb::list out;
        for (const ember::BackendDevice& d : devices) {
          nb::dict e;
          e["device"] = d.backend == "cpu" ? std::string("cpu") : d.backend + ":" + std::to_string(d.index);
          e["backend"] = d.backend;
          e["name"] = d.name;
          e["type"] = d.type;
          e["memory_bytes"] = d.memory_bytes;
          e["memory_free_bytes"] = d.memory_free_bytes;
          e["usable"] = d.unusable.empty();
          e["unusable"] = d.unusable;
          out.append(e);
        }
        return nb::make_tuple(out, notes);
      },
      "(devices, notes): every device of the backends built in (dicts: device, backend, name, type, "
      "memory_bytes, memory_free_bytes, usable, unusable), and one note per backend that offers "
      "none, saying why (not built in, no Vulkan loader, no driver).");
}
