// vulkan/elementwise.cpp: add, add_bias, silu_mul, gelu_mul, scale, softcap and gelu, one shader (an
// op code).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

enum ElementwiseOp : uint32_t {
  kAdd = 0,
  kAddBias = 1,
  kSiluMul = 2,
  kGeluMul = 3,
  kScale = 4,
  kSoftcap = 5,
  kGelu = 6
};

struct ElementwisePush {
  uint64_t a, b, y;
  uint32_t n, n_cols, op;
  float s;
};

}  // namespace

void VulkanBackend::elementwise(uint32_t op, const float* a, const float* b, int64_t n, int64_t n_cols,
                                float s, float* y) {
  if (n == 0) return;
  const ElementwisePush push{device_.device_address(a),
                             b ? device_.device_address(b) : 0,
                             device_.device_address(y),
                             static_cast<uint32_t>(n),
                             static_cast<uint32_t>(n_cols),
                             op,
                             s};
  const vk::Grid g = vk::grid((n + 255) / 256);
  device_.dispatch("elementwise", &push, sizeof(push), g.x, g.y);
}

void VulkanBackend::add(const float* a, const float* b, int64_t n, float* y) {
  elementwise(kAdd, a, b, n, 1, 0, y);
}

void VulkanBackend::add_bias(float* x, const float* bias, int64_t n_rows, int64_t n_cols) {
  elementwise(kAddBias, x, bias, n_rows * n_cols, n_cols, 0, x);
}

void VulkanBackend::silu_mul(const float* gate, const float* up, int64_t n, float* y) {
  elementwise(kSiluMul, gate, up, n, 1, 0, y);
}

void VulkanBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* y) {
  elementwise(kGeluMul, gate, up, n, 1, 0, y);
}

void VulkanBackend::gelu(const float* x, int64_t n, float* y) { elementwise(kGelu, x, nullptr, n, 1, 0, y); }

void VulkanBackend::scale(float* x, int64_t n, float s) { elementwise(kScale, x, nullptr, n, 1, s, x); }

void VulkanBackend::softcap(float* x, int64_t n, float cap) {
  elementwise(kSoftcap, x, nullptr, n, 1, cap, x);
}

}  // namespace ember
