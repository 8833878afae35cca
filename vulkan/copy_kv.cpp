// vulkan/copy_kv.cpp: the leading rows of one paged-cache block into another (copy on write of
// a partially shared prefix block), as buffer copies recorded in the command stream.
#include <vector>

#include "vulkan/backend_vulkan.h"

namespace ember {

void VulkanBackend::copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) {
  // KVView's layout: each kv head's rows of a block lie together, so each head is one region.
  std::vector<VkBufferCopy> regions;
  for (int64_t h = 0; h < kv.n_head_kv; ++h) {
    const int64_t from = ((int64_t{src_block} * kv.n_head_kv + h) * kv.block_size) * kv.head_bytes;
    const int64_t to = ((int64_t{dst_block} * kv.n_head_kv + h) * kv.block_size) * kv.head_bytes;
    regions.push_back({static_cast<VkDeviceSize>(from), static_cast<VkDeviceSize>(to),
                       static_cast<VkDeviceSize>(n_slots * kv.head_bytes)});
  }
  const auto n = static_cast<uint32_t>(regions.size());
  device_.copy_within(kv.k, regions.data(), n);
  device_.copy_within(kv.v, regions.data(), n);
}

}  // namespace ember
