// vulkan/matmul.cpp: y = x · Wᵀ as matmul_vec (under 8 rows: decode) or matmul_mat (prefill).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct MatmulPush {
  uint64_t w, x, y;
  uint32_t n_in, n_out, n_rows;
};

}  // namespace

void VulkanBackend::matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x,
                           int64_t n_rows, float* y) {
  const MatmulPush push{device_.device_address(w), device_.device_address(x), device_.device_address(y),
                        static_cast<uint32_t>(n_in), static_cast<uint32_t>(n_out),
                        static_cast<uint32_t>(n_rows)};
  if (n_rows < matmul_exact_min_rows(wtype)) {
    const vk::Grid g = vk::grid(n_out * ((n_rows + 3) / 4));
    device_.dispatch(vk::shader_of("matmul_vec", wtype).c_str(), &push, sizeof(push), g.x, g.y);
  } else {
    const vk::Grid g = vk::grid(((n_out + 31) / 32) * ((n_rows + 31) / 32));
    device_.dispatch(vk::shader_of("matmul_mat", wtype).c_str(), &push, sizeof(push), g.x, g.y);
  }
}

}  // namespace ember
