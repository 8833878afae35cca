// backend_registry.cpp: the one place (with CMake) that knows which backends this build has.
// Vulkan registers here behind EMBER_HAS_VULKAN (CMake's EMBER_VULKAN); CUDA and Metal will too.
#include <charconv>

#include "backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/backend_cpu.h"
#if EMBER_HAS_VULKAN
#include "vulkan/backend_vulkan.h"
#endif

namespace ember {

namespace {

BackendDevice cpu_device() {
  BackendDevice d;
  d.backend = "cpu";
  d.name = cat("cpu (", ThreadPool::default_n_threads(), " threads)");
  d.type = "cpu";
  return d;
}

// "vulkan" -> 0, "vulkan:3" -> 3; -1 for anything else.
int vulkan_index(std::string_view name) {
  if (name == "vulkan") return 0;
  constexpr std::string_view prefix = "vulkan:";
  if (name.substr(0, prefix.size()) != prefix) return -1;
  const std::string_view digits = name.substr(prefix.size());
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  return ec == std::errc() && end == digits.data() + digits.size() ? index : -1;
}

}  // namespace

std::vector<std::string> available_backends() {
#if EMBER_HAS_VULKAN
  return {"cpu", "vulkan"};
#else
  return {"cpu"};
#endif
}

std::vector<BackendDevice> list_devices(std::vector<std::string>* notes) {
  std::vector<BackendDevice> devices = {cpu_device()};
#if EMBER_HAS_VULKAN
  try {
    for (BackendDevice& d : vulkan_devices()) devices.push_back(std::move(d));
    if (devices.size() == 1 && notes) notes->push_back("vulkan: the Vulkan loader lists no devices");
  } catch (const Unsupported& e) {
    if (notes) notes->push_back(e.what());
  }
#else
  if (notes) {
    notes->push_back(
        "vulkan: this build has no Vulkan backend (pip install . -C cmake.define.EMBER_VULKAN=ON)");
  }
#endif
  return devices;
}

std::unique_ptr<Backend> make_backend(std::string_view name, int n_threads) {
  if (name == "cpu") return std::make_unique<CpuBackend>(n_threads);
  if (name == "auto") {
#if EMBER_HAS_VULKAN
    std::vector<std::string> notes;
    for (const BackendDevice& d : list_devices(&notes)) {
      if (d.backend == "vulkan" && d.type != "cpu" && d.unusable.empty()) {
        return std::make_unique<VulkanBackend>(d.index);
      }
    }
#endif
    return std::make_unique<CpuBackend>(n_threads);
  }
  const int index = vulkan_index(name);
#if EMBER_HAS_VULKAN
  if (index >= 0) return std::make_unique<VulkanBackend>(index);
#endif
  std::string names;
  for (const std::string& n : available_backends()) names += names.empty() ? n : ", " + n;
  if (index >= 0) {
    throw Unsupported(cat("[backend] '", name, "': this build has no Vulkan backend (available: ", names,
                          "); build it with pip install . -C cmake.define.EMBER_VULKAN=ON"));
  }
  throw Unsupported(cat("[backend] unknown device '", name,
                        "'; expected auto, cpu, vulkan or vulkan:N (available: ", names, ")"));
}

}  // namespace ember
