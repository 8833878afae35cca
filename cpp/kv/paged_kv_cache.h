// kv/paged_kv_cache.h: the memory of the paged KV cache — K and V rows (f16 or q8_0) for every
// slot of every block, per layer — shared by all sequences. Which slots a sequence owns is
// decided by the KVCacheManager; this only stores rows and hands ops a KVView over a block table.
#pragma once

#include <cstdint>

#include "backend.h"

namespace ember {

struct PagedKVCache {
  Buffer k;                 // [n_layer, n_blocks] blocks of keys of `type` (KVView's layout)
  Buffer v;                 // [n_layer, n_blocks] blocks of values
  DType type = DType::f16;  // f16 or q8_0 (see KVView)
  int64_t n_layer = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  int64_t n_head_kv = 0;
  int64_t n_kv_dim = 0;    // n_head_kv * head_dim: values of one K (or V) row
  int64_t head_bytes = 0;  // bytes of one kv head's values: 2 * head_dim (f16), head_dim / 32 * 34 (q8_0)
  int64_t row_bytes = 0;   // bytes of one K (or V) row, all heads: n_head_kv * head_bytes

  PagedKVCache() = default;
  // Throws InvalidArgument for non-positive sizes, a cache past the address space, or q8_0
  // heads that are not whole blocks; Unsupported for a type other than f16 and q8_0.
  PagedKVCache(Backend& backend, int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t n_blocks,
               int64_t block_size, DType type = DType::f16);

  // Throws Unsupported, naming head_dim, unless a cache of `type` can hold heads of head_dim
  // values: any head_dim for f16; a multiple of 32 for q8_0 (a block must not straddle heads).
  // Unsupported too for a type other than f16 and q8_0.
  static void check_type(DType type, int64_t head_dim);

  int64_t n_slots() const { return n_blocks * block_size; }
  int64_t layer_bytes() const { return n_slots() * row_bytes; }  // from one layer's K (or V) to the next
  // Bytes one token takes over all layers, K and V: the unit of a KV budget in bytes.
  static int64_t bytes_per_token(int64_t n_layer, int64_t n_kv_dim, DType type) {
    return 2 * n_layer * ember::row_bytes(type, n_kv_dim);
  }

  // Layer il of one sequence: position t is in block block_table[t / block_size].
  // block_table [ceil(n_positions / block_size)] must outlive the view.
  KVView layer(int64_t il, const int32_t* block_table) const {
    KVView view;
    view.type = type;
    view.k = k.as<uint8_t>() + il * layer_bytes();
    view.v = v.as<uint8_t>() + il * layer_bytes();
    view.n_head_kv = n_head_kv;
    view.head_bytes = head_bytes;
    view.block_table = block_table;
    view.block_size = block_size;
    return view;
  }
};

}  // namespace ember
