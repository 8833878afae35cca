// kv/paged_kv_cache.h: the memory of the paged KV cache — f16 K and V rows for every slot of
// every block, per layer — shared by all sequences. Which slots a sequence owns is decided by
// the KVCacheManager; this only stores rows and hands ops a KVView over a block table.
#pragma once

#include <cstdint>

#include "backend.h"

namespace ember {

struct PagedKVCache {
  Buffer k;                // f16 [n_layer, n_blocks * block_size, n_kv_dim]
  Buffer v;                // f16 [n_layer, n_blocks * block_size, n_kv_dim]
  int64_t n_layer = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv_dim = 0;    // n_head_kv * head_dim: one K (or V) row

  PagedKVCache() = default;
  // Throws InvalidArgument for non-positive sizes or a cache past the address space.
  PagedKVCache(Backend& backend, int64_t n_layer, int64_t n_kv_dim, int64_t n_blocks, int64_t block_size);

  int64_t n_slots() const { return n_blocks * block_size; }
  // Bytes one token takes over all layers, K and V: the unit of a KV budget in bytes.
  static int64_t bytes_per_token(int64_t n_layer, int64_t n_kv_dim) { return 2 * n_layer * n_kv_dim * 2; }

  // Layer il of one sequence: position t is slot block_table[t / block_size] * block_size +
  // t % block_size. block_table [ceil(n_positions / block_size)] must outlive the view.
  KVView layer(int64_t il, const int32_t* block_table) const {
    KVView view;
    view.k = k.as<uint16_t>() + il * n_slots() * n_kv_dim;
    view.v = v.as<uint16_t>() + il * n_slots() * n_kv_dim;
    view.row_stride = n_kv_dim;
    view.block_table = block_table;
    view.block_size = block_size;
    return view;
  }
};

}  // namespace ember
