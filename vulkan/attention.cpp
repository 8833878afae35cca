// vulkan/attention.cpp: causal attention over a (paged) KV cache in device memory, one workgroup
// per (row, head).
#include "vulkan/backend_vulkan.h"
#include "vulkan/dispatch.h"

namespace ember {

namespace {

struct AttentionPush {
  uint64_t q, out, k_cache, v_cache, positions, block_table;
  uint32_t n_rows, n_head, n_head_kv, head_dim, head_u16, block_size, paged, window;
  float scale, softcap;
};

}  // namespace

void VulkanBackend::attention(const float* q, const int32_t* positions, int64_t n_rows, const KVView& kv,
                              const AttentionParams& params, float* out) {
  if (n_rows == 0) return;
  const int64_t max_pos = positions[n_rows - 1] > positions[0] ? positions[n_rows - 1] : positions[0];
  const size_t table_bytes = kv.block_table
                                 ? sizeof(int32_t) * static_cast<size_t>(max_pos / kv.block_size + 1)
                                 : 0;
  const AttentionPush push{device_.device_address(q),
                           device_.device_address(out),
                           device_.device_address(kv.k),
                           device_.device_address(kv.v),
                           device_.argument(positions, sizeof(int32_t) * n_rows),
                           kv.block_table ? device_.argument(kv.block_table, table_bytes) : 0,
                           static_cast<uint32_t>(n_rows),
                           static_cast<uint32_t>(params.n_head),
                           static_cast<uint32_t>(params.n_head_kv),
                           static_cast<uint32_t>(params.head_dim),
                           static_cast<uint32_t>(kv.head_bytes / 2),
                           static_cast<uint32_t>(kv.block_size),
                           kv.block_table ? 1u : 0u,
                           static_cast<uint32_t>(params.window),
                           params.scale,
                           params.softcap};
  const vk::Grid g = vk::grid(n_rows * params.n_head);
  device_.dispatch(kv.type == DType::q8_0 ? "attention_q8_0" : "attention_f16", &push, sizeof(push), g.x,
                   g.y);
}

}  // namespace ember
