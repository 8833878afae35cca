// backend_registry.cpp: the one place (with CMake) that knows which backends this build has.
// CUDA and Metal register here, behind their CMake options, when they exist.
#include "backend.h"
#include "core/error.h"
#include "cpu/backend_cpu.h"

namespace ember {

std::vector<std::string> available_backends() { return {"cpu"}; }

std::unique_ptr<Backend> make_backend(std::string_view name, int n_threads) {
  if (name == "cpu") return std::make_unique<CpuBackend>(n_threads);
  std::string names;
  for (const std::string& n : available_backends()) names += names.empty() ? n : ", " + n;
  throw Unsupported(cat("[backend] '", name, "' is not available in this build; available: ", names));
}

}  // namespace ember
