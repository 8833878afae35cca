// kv/block_pool.cpp: owns every KV block and its refcount; knows nothing of requests.
#include "kv/block_pool.h"

#include <algorithm>
#include <stdexcept>

#include "core/error.h"

namespace ember {

BlockPool::BlockPool(int64_t n_blocks, int block_size, BlockHashFn hash)
    : block_size_(block_size), hash_(hash) {
  if (block_size < 1) throw InvalidArgument(cat("[kv] block_size must be >= 1, got ", block_size));
  if (n_blocks < 1 || n_blocks > INT32_MAX / block_size) {
    throw InvalidArgument(cat("[kv] the KV cache needs 1 .. ", INT32_MAX / block_size, " blocks of ",
                              block_size, " tokens, got ", n_blocks));
  }
  blocks_.resize(n_blocks);
  cached_tokens_.resize(n_blocks * block_size);
  // Pop order 0, 1, 2, ...: fresh pools hand out ascending ids, which keeps tests readable.
  free_list_.reserve(n_blocks);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<BlockId>(b));
  cached_.reserve(n_blocks);
  first_child_.assign(n_blocks + 1, kNoBlock);
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(n_allocatable()) / static_cast<double>(n_blocks());
}

std::optional<std::vector<BlockId>> BlockPool::allocate(int64_t n) {
  if (n < 0 || n > n_allocatable()) return std::nullopt;
  std::vector<BlockId> out;
  out.reserve(n);
  while (static_cast<int64_t>(out.size()) < n) {
    BlockId b;
    if (!free_list_.empty()) {
      b = free_list_.back();
      free_list_.pop_back();
    } else {
      b = evict_lru();
    }
    blocks_[b].ref_count = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::ref(BlockId block) {
  Block& b = blocks_.at(block);
  if (!b.cached) throw std::logic_error(cat("[kv] ref of block ", block, ", which is not cached"));
  if (b.ref_count == 0) lru_remove(block);
  ++b.ref_count;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    Block& b = blocks_.at(id);
    if (b.ref_count <= 0) {
      throw std::logic_error(cat("[kv] release of block ", id, ", which has no references (double free)"));
    }
    if (--b.ref_count > 0) continue;
    if (b.cached) {
      lru_push_back(id);
    } else {
      free_list_.push_back(id);
    }
  }
}

bool BlockPool::matches(BlockId block, PrefixLink parent, std::span<const int32_t> tokens) const {
  const Block& b = blocks_[block];
  return b.cached && b.n_tokens == block_size_ && b.parent == parent &&
         std::ranges::equal(tokens_of(block), tokens);
}

bool BlockPool::is_cached(PrefixLink link) const {
  if (link.block == kNoBlock) return true;  // the root
  const Block& b = blocks_.at(link.block);
  return b.cached && b.generation == link.generation;
}

std::optional<PrefixLink> BlockPool::find_cached(PrefixLink parent, std::span<const int32_t> tokens) const {
  if (static_cast<int64_t>(tokens.size()) != block_size_ || !is_cached(parent)) return std::nullopt;
  const auto it = cached_.find(hash_(hash_of(parent), tokens));
  if (it == cached_.end() || !matches(it->second, parent, tokens)) return std::nullopt;
  return PrefixLink{it->second, blocks_[it->second].generation};
}

std::optional<PrefixLink> BlockPool::cache(BlockId block, PrefixLink parent,
                                           std::span<const int32_t> tokens) {
  Block& b = blocks_.at(block);
  if (static_cast<int64_t>(tokens.size()) != block_size_) {
    throw std::logic_error(
        cat("[kv] cache of block ", block, " with ", tokens.size(), " tokens, blocks hold ", block_size_));
  }
  if (b.ref_count <= 0)
    throw std::logic_error(cat("[kv] cache of block ", block, ", which is not referenced"));
  if (b.cached && b.n_tokens == block_size_) {  // already registered (a prefix hit, or cached before)
    if (!matches(block, parent, tokens)) {
      throw std::logic_error(cat("[kv] block ", block, " is cached with a different prefix"));
    }
    return PrefixLink{block, b.generation};
  }
  if (b.cached) {  // partial until now: its owner filled it
    if (b.parent != parent || !std::ranges::equal(tokens_of(block), tokens.first(b.n_tokens))) {
      throw std::logic_error(cat("[kv] block ", block, " is cached partially with a different prefix"));
    }
    uncache(block);  // cached again below as full, or left uncached
  }
  if (!is_cached(parent)) return std::nullopt;
  const BlockHash hash = hash_(hash_of(parent), tokens);
  const auto [it, inserted] = cached_.try_emplace(hash, block);
  if (!inserted) {
    // Another block holds this hash: the same prefix computed twice (share it), or a collision.
    if (matches(it->second, parent, tokens)) return PrefixLink{it->second, blocks_[it->second].generation};
    return std::nullopt;
  }
  b.cached = true;
  b.n_tokens = block_size_;
  b.hash = hash;
  b.parent = parent;
  std::ranges::copy(tokens, cached_tokens_.begin() + int64_t{block} * block_size_);
  children_add(block);
  return PrefixLink{block, b.generation};
}

bool BlockPool::cache_partial(BlockId block, PrefixLink parent, std::span<const int32_t> tokens) {
  Block& b = blocks_.at(block);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n >= block_size_) {
    throw std::logic_error(
        cat("[kv] partial cache of block ", block, " with ", n, " tokens, blocks hold ", block_size_));
  }
  if (b.ref_count <= 0)
    throw std::logic_error(cat("[kv] partial cache of block ", block, ", which is not referenced"));
  if (b.cached) {
    if (b.n_tokens == block_size_ || b.parent != parent || b.n_tokens > n ||
        !std::ranges::equal(tokens_of(block), tokens.first(b.n_tokens))) {
      throw std::logic_error(cat("[kv] block ", block, " is cached with other tokens than its owner's"));
    }
  } else {
    if (!is_cached(parent)) return false;
    b.cached = true;
    b.parent = parent;
    children_add(block);
    ++n_partial_;
  }
  b.n_tokens = static_cast<int32_t>(n);
  std::ranges::copy(tokens, cached_tokens_.begin() + int64_t{block} * block_size_);
  return true;
}

std::optional<PrefixMatch> BlockPool::find_longest_prefix(PrefixLink parent,
                                                          std::span<const int32_t> tokens) const {
  if (tokens.empty() || !is_cached(parent)) return std::nullopt;
  std::optional<PrefixMatch> best;
  for (BlockId c = first_child(parent.block); c != kNoBlock; c = blocks_[c].sibling_next) {
    if (blocks_[c].parent != parent) continue;  // a child of an older block with this id
    const auto own = tokens_of(c);
    const int64_t n_common = std::mismatch(own.begin(), own.end(), tokens.begin(), tokens.end()).first -
                             own.begin();
    if (n_common > 0 && (!best || n_common > best->n_tokens)) {
      best = PrefixMatch{PrefixLink{c, blocks_[c].generation}, n_common};
    }
  }
  return best;
}

std::vector<BlockId> BlockPool::evictable_blocks() const {
  std::vector<BlockId> out;
  for (BlockId b = lru_head_; b != kNoBlock; b = blocks_[b].lru_next) out.push_back(b);
  return out;
}

void BlockPool::lru_push_back(BlockId block) {
  Block& b = blocks_[block];
  b.lru_prev = lru_tail_;
  b.lru_next = kNoBlock;
  (lru_tail_ == kNoBlock ? lru_head_ : blocks_[lru_tail_].lru_next) = block;
  lru_tail_ = block;
  ++n_evictable_;
}

void BlockPool::lru_remove(BlockId block) {
  Block& b = blocks_[block];
  (b.lru_prev == kNoBlock ? lru_head_ : blocks_[b.lru_prev].lru_next) = b.lru_next;
  (b.lru_next == kNoBlock ? lru_tail_ : blocks_[b.lru_next].lru_prev) = b.lru_prev;
  b.lru_prev = b.lru_next = kNoBlock;
  --n_evictable_;
}

void BlockPool::children_add(BlockId block) {
  Block& b = blocks_[block];
  BlockId& head = first_child(b.parent.block);
  b.sibling_prev = kNoBlock;
  b.sibling_next = head;
  if (head != kNoBlock) blocks_[head].sibling_prev = block;
  head = block;
}

void BlockPool::children_remove(BlockId block) {
  Block& b = blocks_[block];
  (b.sibling_prev == kNoBlock ? first_child(b.parent.block)
                              : blocks_[b.sibling_prev].sibling_next) = b.sibling_next;
  if (b.sibling_next != kNoBlock) blocks_[b.sibling_next].sibling_prev = b.sibling_prev;
  b.sibling_prev = b.sibling_next = kNoBlock;
}

void BlockPool::uncache(BlockId block) {
  Block& b = blocks_[block];
  children_remove(block);
  if (b.n_tokens == block_size_) {
    cached_.erase(b.hash);
  } else {
    --n_partial_;
  }
  b.cached = false;
  b.n_tokens = 0;
  b.parent = PrefixLink{};
  ++b.generation;
}

// Takes the least recently released cached block out of the cache. Only called when the free
// list is empty and an evictable block exists.
BlockId BlockPool::evict_lru() {
  const BlockId block = lru_head_;
  lru_remove(block);
  uncache(block);
  return block;
}

void BlockPool::check_invariants() const {
  const auto fail = [](const auto&... what) {
    throw std::logic_error(cat("[kv] invariant broken: ", what...));
  };
  const int64_t n = n_blocks();
  std::vector<uint8_t> on_free(n, 0), on_lru(n, 0);
  for (BlockId b : free_list_) {
    if (b < 0 || b >= n) fail("free list holds block id ", b);
    if (on_free[b]++) fail("block ", b, " is twice on the free list");
  }
  int64_t n_lru = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = lru_head_; b != kNoBlock; prev = b, b = blocks_[b].lru_next) {
    if (b < 0 || b >= n || on_lru[b]++ || n_lru++ > n) fail("the LRU list is corrupt at block ", b);
    if (blocks_[b].lru_prev != prev) fail("LRU back link of block ", b, " is ", blocks_[b].lru_prev);
  }
  if (prev != lru_tail_) fail("LRU tail is ", lru_tail_, ", the list ends at ", prev);
  if (n_lru != n_evictable_) fail(n_lru, " blocks on the LRU list, counted ", n_evictable_);
  int64_t n_cached_blocks = 0, n_partial_blocks = 0;
  for (BlockId b = 0; b < n; ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref_count < 0) fail("block ", b, " has ref_count ", blk.ref_count);
    const bool want_free = blk.ref_count == 0 && !blk.cached;
    const bool want_lru = blk.ref_count == 0 && blk.cached;
    if (bool(on_free[b]) != want_free)
      fail("block ", b, " (refs ", blk.ref_count, ", cached ", blk.cached, ") ", on_free[b] ? "is" : "is not",
           " on the free list");
    if (bool(on_lru[b]) != want_lru)
      fail("block ", b, " (refs ", blk.ref_count, ", cached ", blk.cached, ") ", on_lru[b] ? "is" : "is not",
           " on the LRU list");
    if (!blk.cached) continue;
    if (blk.n_tokens < 1 || blk.n_tokens > block_size_)
      fail("cached block ", b, " holds ", blk.n_tokens, " tokens");
    if (blk.n_tokens < block_size_) {
      ++n_partial_blocks;
      continue;
    }
    ++n_cached_blocks;
    const auto it = cached_.find(blk.hash);
    if (it == cached_.end() || it->second != b) fail("cached block ", b, " is not in the hash map");
    if (is_cached(blk.parent) && blk.hash != hash_(hash_of(blk.parent), tokens_of(b))) {
      fail("cached block ", b, " has a hash that is not hash(parent, tokens)");
    }
  }
  if (n_cached_blocks != static_cast<int64_t>(cached_.size())) {
    fail("the hash map has ", cached_.size(), " entries for ", n_cached_blocks, " cached blocks");
  }
  if (n_partial_blocks != n_partial_) fail(n_partial_blocks, " partial blocks, counted ", n_partial_);
  // Every cached block is on its parent's children list once, and nothing else is.
  int64_t n_listed = 0;
  std::vector<uint8_t> listed(n, 0);
  for (BlockId parent = kNoBlock; parent < n; ++parent) {
    BlockId prev = kNoBlock;
    for (BlockId c = first_child(parent); c != kNoBlock; prev = c, c = blocks_[c].sibling_next) {
      if (c < 0 || c >= n || listed[c]++ || n_listed++ > n)
        fail("the children of block ", parent, " are corrupt");
      if (!blocks_[c].cached || blocks_[c].parent.block != parent)
        fail("block ", c, " is listed as a cached child of block ", parent);
      if (blocks_[c].sibling_prev != prev)
        fail("sibling back link of block ", c, " is ", blocks_[c].sibling_prev);
    }
  }
  if (n_listed != n_cached_blocks + n_partial_blocks)
    fail(n_listed, " blocks on children lists, ", n_cached_blocks + n_partial_blocks, " cached");
}

}  // namespace ember
