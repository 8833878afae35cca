// vulkan/rms_norm.cpp: RMSNorm over rows (one workgroup per row).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct RmsNormPush {
  uint64_t x, weight, y;
  uint32_t n_cols, n_rows;
  float eps;
};

}  // namespace

void VulkanBackend::rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t n_cols, float eps,
                             float* y) {
  const RmsNormPush push{device_.device_address(x),     device_.device_address(weight),
                         device_.device_address(y),     static_cast<uint32_t>(n_cols),
                         static_cast<uint32_t>(n_rows), eps};
  const vk::Grid g = vk::grid(n_rows);
  device_.dispatch("rms_norm", &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
