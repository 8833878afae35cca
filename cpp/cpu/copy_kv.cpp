// cpu/copy_kv.cpp: copies the leading rows of one paged-cache block into another (copy on
// write of a partially shared prefix block).
#include <cstring>

#include "cpu/ops.h"

namespace ember::cpu {

void copy_kv(const KVView& kv, int32_t src_block, int32_t dst_block, int64_t n_slots) {
  // KVView's layout: each kv head's rows of a block lie together, so each head is one range.
  const size_t n_bytes = static_cast<size_t>(n_slots * kv.head_bytes);
  for (int64_t h = 0; h < kv.n_head_kv; ++h) {
    const int64_t from = ((int64_t{src_block} * kv.n_head_kv + h) * kv.block_size) * kv.head_bytes;
    const int64_t to = ((int64_t{dst_block} * kv.n_head_kv + h) * kv.block_size) * kv.head_bytes;
    std::memcpy(kv.k + to, kv.k + from, n_bytes);
    std::memcpy(kv.v + to, kv.v + from, n_bytes);
  }
}

}  // namespace ember::cpu
