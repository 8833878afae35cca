// vulkan/get_rows.cpp: rows of a table, dequantized (one workgroup per id).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct GetRowsPush {
  uint64_t table, ids, y;
  uint32_t n_cols, n_ids;
};

}  // namespace

void VulkanBackend::get_rows(DType type, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids,
                             float* y) {
  if (n_ids == 0) return;
  const GetRowsPush push{device_.device_address(table), device_.argument(ids, sizeof(int32_t) * n_ids),
                         device_.device_address(y), static_cast<uint32_t>(n_cols),
                         static_cast<uint32_t>(n_ids)};
  const vk::Grid g = vk::grid(n_ids);
  device_.dispatch(vk::shader_of("get_rows", type).c_str(), &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
