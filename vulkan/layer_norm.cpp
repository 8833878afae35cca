// vulkan/layer_norm.cpp: LayerNorm over rows (one workgroup per row): the vision towers' norm.
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct LayerNormPush {
  uint64_t x, weight, bias, y;
  uint32_t n_cols, n_rows;
  float eps;
};

}  // namespace

void VulkanBackend::layer_norm(const float* x, const float* weight, const float* bias, int64_t n_rows,
                               int64_t n_cols, float eps, float* y) {
  const LayerNormPush push{device_.device_address(x),
                           device_.device_address(weight),
                           device_.device_address(bias),
                           device_.device_address(y),
                           static_cast<uint32_t>(n_cols),
                           static_cast<uint32_t>(n_rows),
                           eps};
  const vk::Grid g = vk::grid(n_rows);
  device_.dispatch("layer_norm", &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
