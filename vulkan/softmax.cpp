// vulkan/softmax.cpp: softmax over rows in place (one workgroup per row).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct SoftmaxPush {
  uint64_t x;
  uint32_t n_cols, n_rows;
};

}  // namespace

void VulkanBackend::softmax(float* x, int64_t n_rows, int64_t n_cols) {
  const SoftmaxPush push{device_.device_address(x), static_cast<uint32_t>(n_cols),
                         static_cast<uint32_t>(n_rows)};
  const vk::Grid g = vk::grid(n_rows);
  device_.dispatch("softmax", &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
