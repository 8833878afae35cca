// vulkan/rope.cpp: rotary position embedding in place (one invocation per rotated pair).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct RopePush {
  uint64_t x, positions, inv_freq;
  uint32_t n_rows, n_heads, head_dim, n_pairs, neox;
  float mscale;
};

}  // namespace

void VulkanBackend::rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                         const int32_t* positions, const RopeParams& params) {
  const int64_t n_pairs = params.n_rot / 2;
  if (n_pairs == 0 || n_rows == 0) return;
  const RopePush push{device_.device_address(x),
                      device_.argument(positions, sizeof(int32_t) * n_rows),
                      device_.argument(params.inv_freq, sizeof(float) * n_pairs),
                      static_cast<uint32_t>(n_rows),
                      static_cast<uint32_t>(n_heads),
                      static_cast<uint32_t>(head_dim),
                      static_cast<uint32_t>(n_pairs),
                      params.layout == RopeLayout::neox ? 1u : 0u,
                      params.mscale};
  const vk::Grid g = vk::grid((n_rows * n_heads * n_pairs + 255) / 256);
  device_.dispatch("rope", &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
