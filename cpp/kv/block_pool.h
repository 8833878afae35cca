// kv/block_pool.h: owns every KV block of the paged cache — refcounts, the free list, and the
// prefix cache (full blocks found by hash(parent, tokens)). Knows nothing of requests: callers
// hand it block ids and token ids. Not thread-safe (the engine thread alone uses it).
//
// Every block is in exactly one of three states:
//   referenced  ref_count > 0 (in some sequence's block table), cached or not;
//   free        ref_count == 0, not cached, on the free list (no useful contents);
//   evictable   ref_count == 0, cached, on the LRU list (contents reusable by a prefix hit).
// Allocation takes free blocks first, then evicts the least recently released evictable block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace ember {

// Index of a block in the pool; block b holds cache slots [b * block_size, (b + 1) * block_size).
using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

// A cached block as a link of a prefix chain: its id and the generation it was cached in. A
// block's generation changes when it is evicted, so a link to a block whose contents were
// replaced never matches again. The root link (block == kNoBlock) stands before a first block.
struct PrefixLink {
  BlockId block = kNoBlock;
  uint32_t generation = 0;
  bool operator==(const PrefixLink&) const = default;
};

// The prefix-cache key function; tests swap in a colliding one to show lookups stay exact.
using BlockHashFn = BlockHash (*)(BlockHash parent, std::span<const int32_t> tokens);

class BlockPool {
 public:
  // n_blocks >= 1 blocks of block_size >= 1 tokens. Throws InvalidArgument otherwise.
  BlockPool(int64_t n_blocks, int block_size, BlockHashFn hash = hash_block);

  int block_size() const { return block_size_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks allocate() can hand out now: free plus evictable.
  int64_t n_allocatable() const { return n_free() + n_evictable_; }
  int64_t n_free() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t n_evictable() const { return n_evictable_; }
  int64_t n_cached() const { return static_cast<int64_t>(cached_.size()); }
  // Fraction of blocks some sequence references, in [0, 1].
  double usage() const;

  // n fresh blocks with ref_count 1 (contents undefined), or nullopt — changing nothing — when
  // fewer than n are allocatable. Evicts least recently released cached blocks as needed.
  std::optional<std::vector<BlockId>> allocate(int64_t n);

  // Takes one more reference on a cached block (a prefix hit). An evictable block leaves the
  // LRU list. Throws std::logic_error when the block is not cached.
  void ref(BlockId block);

  // Drops one reference from each block, in order. A block reaching ref_count 0 becomes
  // evictable (appended as the most recently used) when cached, free otherwise; callers release
  // a table back to front, so a sequence's first blocks — the ones others share — go last.
  // Throws std::logic_error on a block without references (a double free).
  void release(std::span<const BlockId> blocks);

  // The cached block holding `tokens` (exactly block_size of them) after the block `parent`,
  // or nullopt.
  std::optional<PrefixLink> find_cached(PrefixLink parent, std::span<const int32_t> tokens) const;

  // Registers the full, computed, referenced block `block` as holding `tokens` after `parent`.
  // Returns the link later blocks of the sequence should chain to: `block` itself, or the block
  // already cached with the same prefix (then `block` stays uncached). nullopt when the prefix
  // can't be cached: `parent` is no longer cached, or a different prefix owns the hash.
  std::optional<PrefixLink> cache(BlockId block, PrefixLink parent, std::span<const int32_t> tokens);

  // Whether `link` still names a cached block (with the same contents as when it was made).
  bool is_cached(PrefixLink link) const;
  int32_t ref_count(BlockId block) const { return blocks_.at(block).ref_count; }
  bool is_cached(BlockId block) const { return blocks_.at(block).cached; }
  // Evictable blocks, least recently released first (the next to be evicted leads).
  std::vector<BlockId> evictable_blocks() const;

  // Throws std::logic_error describing the first broken invariant (see the top of this file).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    uint32_t generation = 0;                           // bumped on eviction
    BlockHash hash = 0;                                // valid while cached
    PrefixLink parent;                                 // valid while cached
    BlockId lru_prev = kNoBlock, lru_next = kNoBlock;  // while evictable
  };

  std::span<const int32_t> tokens_of(BlockId block) const {
    return {cached_tokens_.data() + int64_t{block} * block_size_, static_cast<size_t>(block_size_)};
  }
  BlockHash hash_of(PrefixLink link) const {
    return link.block == kNoBlock ? kRootBlockHash : blocks_[link.block].hash;
  }
  bool matches(BlockId block, PrefixLink parent, std::span<const int32_t> tokens) const;
  void lru_push_back(BlockId block);
  void lru_remove(BlockId block);
  BlockId evict_lru();

  int block_size_;
  BlockHashFn hash_;
  std::vector<Block> blocks_;           // [n_blocks]
  std::vector<int32_t> cached_tokens_;  // [n_blocks, block_size] token ids of cached blocks
  std::vector<BlockId> free_list_;      // free blocks; allocation pops the back
  int64_t n_evictable_ = 0;
  BlockId lru_head_ = kNoBlock, lru_tail_ = kNoBlock;  // least / most recently released
  std::unordered_map<BlockHash, BlockId> cached_;      // hash -> the one cached block with it
};

}  // namespace ember
