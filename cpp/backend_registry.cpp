// backend_registry.cpp: the one place (with CMake) that knows which backends this build has.
// CUDA and Vulkan register here behind EMBER_HAS_CUDA / EMBER_HAS_VULKAN (CMake's EMBER_CUDA /
// EMBER_VULKAN); Metal will too. "auto" prefers CUDA, then Vulkan, then the CPU.
#include <charconv>

#include "backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/backend_cpu.h"
#if EMBER_HAS_CUDA
#include "cuda/backend_cuda.h"
#endif
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

// device_index("vulkan", "vulkan") -> 0, ("vulkan:3", "vulkan") -> 3; -1 for anything else.
int device_index(std::string_view name, std::string_view backend) {
  if (name == backend) return 0;
  if (name.substr(0, backend.size()) != backend || name.substr(backend.size(), 1) != ":") return -1;
  const std::string_view digits = name.substr(backend.size() + 1);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  return ec == std::errc() && end == digits.data() + digits.size() ? index : -1;
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"cpu"};
#if EMBER_HAS_CUDA
  names.push_back("cuda");
#endif
#if EMBER_HAS_VULKAN
  names.push_back("vulkan");
#endif
  return names;
}

std::vector<BackendDevice> list_devices(std::vector<std::string>* notes) {
  std::vector<BackendDevice> devices = {cpu_device()};
#if EMBER_HAS_CUDA
  try {
    for (BackendDevice& d : cuda_devices()) devices.push_back(std::move(d));
  } catch (const Error& e) {  // Unsupported: no driver or device; Error: a driver call failed
    if (notes) notes->push_back(e.what());
  }
#else
  if (notes) {
    notes->push_back("cuda: this build has no CUDA backend (pip install . -C cmake.define.EMBER_CUDA=ON)");
  }
#endif
#if EMBER_HAS_VULKAN
  try {
    const size_t before = devices.size();
    for (BackendDevice& d : vulkan_devices()) devices.push_back(std::move(d));
    if (devices.size() == before && notes) notes->push_back("vulkan: the Vulkan loader lists no devices");
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
    // The first usable CUDA device, else the first usable Vulkan GPU (not a CPU emulation), else
    // the CPU; list_devices' notes and each device's `unusable` say why one was skipped
    // (`ember info --devices` prints them).
    std::vector<std::string> notes;
    const std::vector<BackendDevice> devices = list_devices(&notes);
    for (const char* backend : {"cuda", "vulkan"}) {
      for (const BackendDevice& d : devices) {
        if (d.backend != backend || d.type == "cpu" || !d.unusable.empty()) continue;
#if EMBER_HAS_CUDA
        if (d.backend == "cuda") return std::make_unique<CudaBackend>(d.index);
#endif
#if EMBER_HAS_VULKAN
        if (d.backend == "vulkan") return std::make_unique<VulkanBackend>(d.index);
#endif
      }
    }
    return std::make_unique<CpuBackend>(n_threads);
  }
  const int cuda = device_index(name, "cuda");
  const int vulkan = device_index(name, "vulkan");
#if EMBER_HAS_CUDA
  if (cuda >= 0) return std::make_unique<CudaBackend>(cuda);
#endif
#if EMBER_HAS_VULKAN
  if (vulkan >= 0) return std::make_unique<VulkanBackend>(vulkan);
#endif
  std::string names;
  for (const std::string& n : available_backends()) names += names.empty() ? n : ", " + n;
  if (cuda >= 0) {
    throw Unsupported(cat("[backend] '", name, "': this build has no CUDA backend (available: ", names,
                          "); build it with pip install . -C cmake.define.EMBER_CUDA=ON"));
  }
  if (vulkan >= 0) {
    throw Unsupported(cat("[backend] '", name, "': this build has no Vulkan backend (available: ", names,
                          "); build it with pip install . -C cmake.define.EMBER_VULKAN=ON"));
  }
  throw Unsupported(cat("[backend] unknown device '", name,
                        "'; expected auto, cpu, cuda, cuda:N, vulkan or vulkan:N (available: ", names, ")"));
}

}  // namespace ember
