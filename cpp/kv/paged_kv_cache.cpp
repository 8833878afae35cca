// kv/paged_kv_cache.cpp: allocation of the paged cache's K/V memory, sized by its element type.
#include "kv/paged_kv_cache.h"

#include "core/error.h"
#include "quant/blocks.h"

namespace ember {

namespace {

void check_known_type(DType type) {
  if (type != DType::f16 && type != DType::q8_0) {
    throw Unsupported(cat("[kv] KV cache type '", dtype_name(type), "' is not supported; use f16 or q8_0"));
  }
}

}  // namespace

void PagedKVCache::check_type(DType type, int64_t head_dim) {
  check_known_type(type);
  if (type == DType::q8_0 && head_dim % kQK != 0) {
    throw Unsupported(cat("[kv] a q8_0 KV cache needs head_dim to be a multiple of ", kQK,
                          " (a block must not straddle two heads); this model's head_dim is ", head_dim,
                          ": use kv_type f16 (the default)"));
  }
}

PagedKVCache::PagedKVCache(Backend& backend, int64_t n_layer_, int64_t n_head_kv_, int64_t head_dim,
                           int64_t n_blocks_, int64_t block_size_, DType type_)
    : type(type_),
      n_layer(n_layer_),
      n_blocks(n_blocks_),
      block_size(block_size_),
      n_head_kv(n_head_kv_),
      n_kv_dim(n_head_kv_ * head_dim) {
  if (n_layer < 1 || n_head_kv < 1 || head_dim < 1 || n_blocks < 1 || block_size < 1) {
    throw InvalidArgument(cat("[kv] paged cache of ", n_layer, " layers x ", n_blocks, " blocks x ",
                              block_size, " tokens x ", n_head_kv, " heads x ", head_dim,
                              " values: every size must be >= 1"));
  }
  check_known_type(type);
  if (head_dim % type_traits(type).block_size != 0) {
    throw InvalidArgument(cat("[kv] ", dtype_name(type), " heads of ", head_dim,
                              " values are not whole blocks of ", type_traits(type).block_size));
  }
  head_bytes = ember::row_bytes(type, head_dim);
  row_bytes = n_head_kv * head_bytes;
  const int64_t n_rows = n_layer * n_slots();
  if (n_slots() / block_size != n_blocks || n_rows / n_layer != n_slots() || n_rows > INT64_MAX / row_bytes) {
    throw InvalidArgument(cat("[kv] paged cache of ", n_blocks, " blocks is too large"));
  }
  const size_t n_bytes = static_cast<size_t>(n_rows * row_bytes);
  k = backend.alloc(n_bytes);
  v = backend.alloc(n_bytes);
}

}  // namespace ember
