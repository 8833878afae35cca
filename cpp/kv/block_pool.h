// kv/block_pool.h: owns every KV block of the paged cache — refcounts, the free list, and the
// prefix cache (full blocks found by hash(parent, tokens); every cached block, full or partial,
// listed under its parent for lookups of a common token prefix). Knows nothing of requests:
// callers hand it block ids and token ids. Not thread-safe (the engine thread alone uses it).
//
// Every block is in exactly one of three states:
//   referenced  ref_count > 0 (in some sequence's block table), cached or not;
//   free        ref_count == 0, not cached, on the free list (no useful contents);
//   evictable   ref_count == 0, cached, on the LRU list (contents reusable by a prefix hit).
// Allocation takes free blocks first, then evicts the least recently released evictable block.
//
// A cached block is full (block_size tokens, in the hash map: sequences share it by reference)
// or partial (1 .. block_size - 1 tokens: the computed head of a sequence's last block, whose
// owner may still append to it). A partial block is never shared: a prompt that continues its
// tokens gets a copy of its rows (copy on write, see KVCacheManager), so it is referenced only
// by its owner and, for the moment of planning a copy, by that copy.
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
// replaced never matches again. A root link (block == kNoBlock) stands before a first block; its
// generation is the chain's namespace (root_link): sequences whose K/V differ for the same
// tokens (another LoRA adapter, or scale) start from different roots, so they never share a block.
struct PrefixLink {
  BlockId block = kNoBlock;
  uint64_t generation = 0;
  bool operator==(const PrefixLink&) const = default;
};

// The root of the prefix chains of namespace `ns` (0: the plain model's).
constexpr PrefixLink root_link(uint64_t ns) { return PrefixLink{kNoBlock, ns}; }

// The cached block after a link whose tokens share the longest common prefix with a lookup's.
struct PrefixMatch {
  PrefixLink link;       // the block (full or partial) and its generation
  int64_t n_tokens = 0;  // its leading tokens equal to the lookup's (>= 1)
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
  int64_t n_cached() const { return static_cast<int64_t>(cached_.size()); }  // full cached blocks
  int64_t n_partial() const { return n_partial_; }                           // partial cached blocks
  // Fraction of blocks some sequence references, in [0, 1].
  double usage() const;

  // n fresh blocks with ref_count 1 (contents undefined), or nullopt — changing nothing — when
  // fewer than n are allocatable. Evicts least recently released cached blocks as needed.
  std::optional<std::vector<BlockId>> allocate(int64_t n);

  // Takes one more reference on a cached block (a prefix hit; for a partial block, the source
  // of a planned copy). An evictable block leaves the LRU list. Throws std::logic_error when
  // the block is not cached.
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

  // Registers the referenced block `block`, not cached full, as holding the K/V of `tokens`
  // (1 .. block_size - 1 of them) after `parent`: a partial block whose rows a later prompt
  // continuing a prefix of those tokens may copy. Its owner goes on appending: a block already
  // partial after `parent` whose tokens begin `tokens` is extended. Returns false, leaving the
  // block as it was, when `parent` is no longer cached. Throws std::logic_error for a full
  // cached block, a partial one with other tokens, or an unreferenced block.
  bool cache_partial(BlockId block, PrefixLink parent, std::span<const int32_t> tokens);

  // The cached block after `parent`, full or partial, whose tokens share the longest common
  // prefix with `tokens` (of any length), or nullopt when none shares a first token.
  std::optional<PrefixMatch> find_longest_prefix(PrefixLink parent, std::span<const int32_t> tokens) const;

  // Whether `link` still names a cached block (with the same contents as when it was made).
  bool is_cached(PrefixLink link) const;
  // The chained hash of a cached link (root_block_hash of its namespace for a root: kRootBlockHash
  // for namespace 0), and of `tokens` after a block of hash `parent`: the key of a block's file in
  // the disk cache too.
  BlockHash hash_of(PrefixLink link) const {
    return link.block == kNoBlock ? root_block_hash(link.generation) : blocks_[link.block].hash;
  }
  BlockHash hash_after(BlockHash parent, std::span<const int32_t> tokens) const {
    return hash_(parent, tokens);
  }
  int32_t ref_count(BlockId block) const { return blocks_.at(block).ref_count; }
  bool is_cached(BlockId block) const { return blocks_.at(block).cached; }
  // Tokens a cached block holds: block_size when full, fewer when partial; 0 when not cached.
  int64_t n_cached_tokens(BlockId block) const {
    const Block& b = blocks_.at(block);
    return b.cached ? b.n_tokens : 0;
  }
  // Evictable blocks, least recently released first (the next to be evicted leads).
  std::vector<BlockId> evictable_blocks() const;

  // Throws std::logic_error describing the first broken invariant (see the top of this file).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    int32_t n_tokens = 0;     // while cached: block_size (full) or fewer (partial)
    uint32_t generation = 0;  // bumped on eviction (and when a partial block is dropped)
    BlockHash hash = 0;       // valid while cached full
    PrefixLink parent;        // valid while cached
    BlockId lru_prev = kNoBlock, lru_next = kNoBlock;  // while evictable
    BlockId sibling_prev = kNoBlock,
            sibling_next = kNoBlock;  // while cached: the list of parent.block's children
  };

  std::span<const int32_t> tokens_of(BlockId block) const {
    return {cached_tokens_.data() + int64_t{block} * block_size_,
            static_cast<size_t>(blocks_[block].n_tokens)};
  }
  BlockId& first_child(BlockId parent) { return first_child_[static_cast<size_t>(parent + 1)]; }
  BlockId first_child(BlockId parent) const { return first_child_[static_cast<size_t>(parent + 1)]; }
  bool matches(BlockId block, PrefixLink parent, std::span<const int32_t> tokens) const;
  void lru_push_back(BlockId block);
  void lru_remove(BlockId block);
  void children_add(BlockId block);
  void children_remove(BlockId block);
  // Takes the block out of the cache (its children list, and the hash map when full); its old
  // links die with a generation bump.
  void uncache(BlockId block);
  BlockId evict_lru();

  int block_size_;
  BlockHashFn hash_;
  std::vector<Block> blocks_;           // [n_blocks]
  std::vector<int32_t> cached_tokens_;  // [n_blocks, block_size] token ids of cached blocks
  std::vector<BlockId> free_list_;      // free blocks; allocation pops the back
  int64_t n_evictable_ = 0;
  BlockId lru_head_ = kNoBlock, lru_tail_ = kNoBlock;  // least / most recently released
  std::unordered_map<BlockHash, BlockId> cached_;      // hash -> the one full cached block with it
  // [n_blocks + 1] head of the list of cached blocks whose parent is block b, at b + 1 (the root
  // at 0). A list may hold blocks whose parent link went stale (a parent evicted and its id
  // cached again): lookups compare the whole link.
  std::vector<BlockId> first_child_;
  int64_t n_partial_ = 0;
};

}  // namespace ember
