// vulkan/store_kv.cpp: new K/V rows into their cache slots, as f16 or q8_0 (one invocation per
// 32 values of a row).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct StoreKVPush {
  uint64_t k, v, k_cache, v_cache, positions, block_table;
  uint32_t n_rows, n_kv_dim, head_dim, head_u16, block_size, paged, q8;
};

// Bytes of the block table a sequence's rows up to position max_pos use.
size_t table_bytes(const KVView& kv, int64_t max_pos) {
  return kv.block_table ? sizeof(int32_t) * static_cast<size_t>(max_pos / kv.block_size + 1) : 0;
}

}  // namespace

void VulkanBackend::store_kv(const KVView& kv, const int32_t* positions, int64_t n_rows, int64_t n_kv_dim,
                             const float* k, const float* v) {
  if (n_rows == 0) return;
  // Positions of a sequence's rows are consecutive (validate_batch), so the last is the largest.
  const int64_t max_pos = positions[n_rows - 1] > positions[0] ? positions[n_rows - 1] : positions[0];
  const StoreKVPush push{device_.device_address(k),
                         device_.device_address(v),
                         device_.device_address(kv.k),
                         device_.device_address(kv.v),
                         device_.argument(positions, sizeof(int32_t) * n_rows),
                         kv.block_table ? device_.argument(kv.block_table, table_bytes(kv, max_pos)) : 0,
                         static_cast<uint32_t>(n_rows),
                         static_cast<uint32_t>(n_kv_dim),
                         static_cast<uint32_t>(n_kv_dim / kv.n_head_kv),
                         static_cast<uint32_t>(kv.head_bytes / 2),
                         static_cast<uint32_t>(kv.block_size),
                         kv.block_table ? 1u : 0u,
                         kv.type == DType::q8_0 ? 1u : 0u};
  const vk::Grid g = vk::grid((n_rows * ((n_kv_dim + 31) / 32) + 63) / 64);
  device_.dispatch("store_kv", &push, sizeof(push), g.x, g.y);
}

}  // namespace ember
