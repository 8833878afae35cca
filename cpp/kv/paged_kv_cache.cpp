// kv/paged_kv_cache.cpp: allocation of the paged cache's K/V memory.
#include "kv/paged_kv_cache.h"

#include "core/error.h"

namespace ember {

PagedKVCache::PagedKVCache(Backend& backend, int64_t n_layer_, int64_t n_kv_dim_, int64_t n_blocks_,
                           int64_t block_size_)
    : n_layer(n_layer_), n_blocks(n_blocks_), block_size(block_size_), n_kv_dim(n_kv_dim_) {
  if (n_layer < 1 || n_kv_dim < 1 || n_blocks < 1 || block_size < 1) {
    throw InvalidArgument(cat("[kv] paged cache of ", n_layer, " layers x ", n_blocks, " blocks x ", block_size,
                              " tokens x ", n_kv_dim, " values: every size must be >= 1"));
  }
  const int64_t n_elements = n_layer * n_slots() * n_kv_dim;
  if (n_slots() / block_size != n_blocks || n_elements / n_kv_dim / n_layer != n_slots() ||
      n_elements > INT64_MAX / 2) {
    throw InvalidArgument(cat("[kv] paged cache of ", n_blocks, " blocks is too large"));
  }
  const size_t n_bytes = sizeof(uint16_t) * static_cast<size_t>(n_elements);
  k = backend.alloc(n_bytes);
  v = backend.alloc(n_bytes);
}

}  // namespace ember
