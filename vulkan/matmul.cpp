// vulkan/matmul.cpp: y = x · Wᵀ as matmul_vec (under 32 rows: decode) or matmul_mat (prefill),
// which give the same bits; for quantized weights x is first rounded to 8 bits per block as the
// CPU backend rounds it (quantize_act), into the backend's activation scratch.
#include "core/error.h"
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

constexpr int64_t kMatMatMinRows = 32;

struct MatmulPush {
  uint64_t w, x, y;
  uint32_t n_in, n_out, n_rows;
};

struct QuantizeActPush {
  uint64_t x, y;
  uint32_t n_blocks;
};

bool quantizes_activations(DType t) { return t != DType::f32 && t != DType::f16 && t != DType::bf16; }

}  // namespace

int64_t VulkanBackend::matmul_exact_min_rows(DType) const { return 1; }

void VulkanBackend::reserve_matmul(int64_t max_rows, int64_t max_n_in) {
  const size_t n_bytes = sizeof(float) * static_cast<size_t>(max_rows * max_n_in);
  if (n_bytes > act_.n_bytes()) act_ = alloc(n_bytes);
}

void VulkanBackend::matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x,
                           int64_t n_rows, float* y) {
  if (n_rows == 0 || n_out == 0) return;
  uint64_t x_address = device_.device_address(x);
  if (quantizes_activations(wtype)) {
    if (act_.n_bytes() < sizeof(float) * static_cast<size_t>(n_rows * n_in)) {
      throw std::logic_error(cat("[vulkan] matmul of ", n_rows, "x", n_in, " past reserve_matmul"));
    }
    const QuantizeActPush q{x_address, device_.device_address(act_.data()),
                            static_cast<uint32_t>(n_rows * n_in / 32)};
    const vk::Grid g = vk::grid((n_rows * n_in / 32 + 63) / 64);
    device_.dispatch("quantize_act", &q, sizeof(q), g.x, g.y);
    x_address = device_.device_address(act_.data());
  }
  const MatmulPush push{device_.device_address(w),    x_address,
                        device_.device_address(y),    static_cast<uint32_t>(n_in),
                        static_cast<uint32_t>(n_out), static_cast<uint32_t>(n_rows)};
  if (n_rows < kMatMatMinRows) {
    device_.dispatch(vk::shader_of("matmul_vec", wtype).c_str(), &push, sizeof(push),
                     static_cast<uint32_t>((n_out + 63) / 64), static_cast<uint32_t>((n_rows + 3) / 4));
  } else {
    const vk::Grid g = vk::grid(((n_out + 31) / 32) * ((n_rows + 31) / 32));
    device_.dispatch(vk::shader_of("matmul_mat", wtype).c_str(), &push, sizeof(push), g.x, g.y);
  }
}

}  // namespace ember
