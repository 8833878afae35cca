// vulkan/backend_vulkan.cpp: the Vulkan backend's device, memory and capabilities (the ops are
// in the files named as their CPU twins).
#include "vulkan/backend_vulkan.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

[[noreturn]] void unreachable_op(const char* op) {
  std::fprintf(stderr, "ember: the vulkan backend has no %s op (a caller skipped supports())\n", op);
  std::abort();
}

BackendDevice to_backend_device(const vk::PhysicalDeviceInfo& info, int index) {
  BackendDevice d;
  d.backend = "vulkan";
  d.index = index;
  d.name = info.name;
  d.type = info.type;
  d.memory_bytes = info.memory_bytes;
  d.memory_free_bytes = info.memory_free_bytes;
  d.unusable = info.unusable;
  return d;
}

}  // namespace

std::vector<BackendDevice> vulkan_devices() {
  const std::shared_ptr<vk::Api> api = vk::open_api();
  std::vector<BackendDevice> out;
  const std::vector<vk::PhysicalDeviceInfo> infos = vk::physical_devices(*api);
  for (size_t i = 0; i < infos.size(); ++i) out.push_back(to_backend_device(infos[i], static_cast<int>(i)));
  return out;
}

VulkanBackend::VulkanBackend(int index) : device_(vk::open_api(), index), index_(index) {}

std::string VulkanBackend::device_name() const {
  return cat("vulkan:", index_, " (", device_.info().name, ")");
}

std::optional<DeviceMemory> VulkanBackend::device_memory() const {
  DeviceMemory m;
  m.total_bytes = device_.info().memory_bytes;
  m.free_bytes = device_.memory_free_bytes();
  return m;
}

bool VulkanBackend::supports(Op op, DType dtype) const {
  switch (op) {
    case Op::matmul:
    case Op::get_rows: return vk::has_weight_shaders(dtype);
    case Op::store_kv:
    case Op::attention: return dtype == DType::f16 || dtype == DType::q8_0;
    case Op::add_rows_scaled: return false;  // nor for mixture-of-experts routing (its host-side top-k)
    default: return dtype == DType::f32;
  }
}

Buffer VulkanBackend::alloc(size_t n_bytes) { return Buffer(this, device_.allocate(n_bytes), n_bytes, true); }

void VulkanBackend::free_buffer(void* data, size_t) { device_.release(data); }

Buffer VulkanBackend::wrap_host(const void* data, size_t n_bytes) {
  Buffer b = alloc(n_bytes);
  upload(b, 0, data, n_bytes);
  return b;
}

Buffer VulkanBackend::prepare_matmul_weight(DType wtype, const void* data, int64_t n_in, int64_t n_out) {
  // The shaders read the file's layout.
  return wrap_host(data, static_cast<size_t>(row_bytes(wtype, n_in) * n_out));
}

void VulkanBackend::upload(const Buffer& dst, size_t offset, const void* src, size_t n_bytes) {
  vk::Resolved r = device_.resolve(dst.data());
  r.offset += offset;
  device_.write(r, src, n_bytes);
}

void VulkanBackend::download(const Buffer& src, size_t offset, void* dst, size_t n_bytes) {
  vk::Resolved r = device_.resolve(src.data());
  r.offset += offset;
  device_.read(r, dst, n_bytes);
}

// Never called: supports() answers no for it, and Model::load refuses the models that need it.
void VulkanBackend::add_rows_scaled(const float*, const int32_t*, const float*, int64_t, int64_t, float*) {
  unreachable_op("add_rows_scaled");
}

}  // namespace ember
