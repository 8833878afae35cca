// kv/kv_cache_manager.h: the per-sequence side of the paged KV cache — block tables, prefix
// hits, slot allocation and the slot mapping a batch writes its K/V rows to. It owns the block
// tables; callers (the scheduler) see only success/failure and token counts. Blocks come from a
// BlockPool. Not thread-safe (the engine thread alone uses it).
//
// Invariant: a sequence's table holds ceil(n / block_size) entries for the n tokens it has slots
// for. It grows, except that trim() gives back a tail of blocks that only rejected speculative
// drafts used (never a cached block); so a device copy of a table only appends, or drops a tail.
// With a window (every layer sliding, Mistral), release_outside_window() gives back leading
// blocks no later position can attend to: their entries become kNoBlock, never read again.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace ember {

using SequenceId = int64_t;

struct KVCacheConfig {
  int block_size = 0;    // tokens per block, >= 1 (the engine's default: EngineOptions::block_size)
  int64_t n_blocks = 0;  // blocks in the pool (see blocks_for_tokens / blocks_for_bytes)
  bool prefix_caching = true;
  // > 0: every layer attends over the last `window` positions only (a sliding window on all
  // layers), so blocks wholly before a sequence's window can be released as it advances.
  int64_t window = 0;

  // Blocks that hold a budget of n_tokens tokens (rounded down, at least one).
  static int64_t blocks_for_tokens(int64_t n_tokens, int block_size);
  // Blocks that fit in n_bytes when one token's K and V of every layer take bytes_per_token
  // (2 * n_layer * n_kv_dim * sizeof(f16) for an f16 cache).
  static int64_t blocks_for_bytes(int64_t n_bytes, int64_t bytes_per_token, int block_size);
};

// What the manager needs to know of a sequence: every token known so far (prompt, then
// output), how many of the leading ones have their K/V in the cache, and the prefix-cache
// namespace its K/V belong to (0: the plain model; a LoRA adapter and scale have their own).
struct SequenceState {
  SequenceId id = 0;
  std::span<const int32_t> tokens;
  int64_t n_computed_tokens = 0;
  uint64_t cache_namespace = 0;
};

// K/V rows to copy before a step's forward pass: slots [0, n_slots) of block src into the same
// slots of block dst, every layer (a partial prefix hit: dst's sequence goes on after them).
struct BlockCopy {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
  int64_t n_slots = 0;  // 1 .. block_size - 1
};

// The cached prefix get_computed_blocks() found for a new sequence, to hand back to
// allocate_slots(): whole shared blocks, then maybe the leading rows of one more cached block
// (full or partial) that the sequence gets a copy of. Callers read its size only; the blocks
// stay the manager's business.
class PrefixHit {
 public:
  int64_t n_tokens() const { return n_tokens_; }
  bool has_partial() const { return n_partial_ > 0; }
  // The same hit without its partial block (when the pool has no room for the copy's source).
  PrefixHit without_partial() const {
    PrefixHit hit = *this;
    hit.n_tokens_ -= hit.n_partial_;
    hit.n_partial_ = 0;
    return hit;
  }

 private:
  friend class KVCacheManager;
  std::vector<PrefixLink> links_;  // [n_tokens / block_size] the shared cached blocks, in order
  PrefixLink partial_;             // the block whose first n_partial_ rows are copied, if any
  int64_t n_partial_ = 0;
  int64_t n_tokens_ = 0;
};

class KVCacheManager {
 public:
  explicit KVCacheManager(const KVCacheConfig& config);

  int block_size() const { return pool_.block_size(); }
  int64_t n_blocks() const { return pool_.n_blocks(); }
  int64_t capacity_tokens() const { return n_blocks() * block_size(); }
  int64_t window() const { return window_; }
  bool prefix_caching() const { return prefix_caching_; }

  // The longest cached prefix of seq.tokens, for a sequence with no slots yet: full blocks
  // shared by reference, then the longest common prefix with a cached block after them (the
  // partially filled last block of a live or finished sequence, or a full block the prompt
  // leaves early), whose rows the sequence will get a copy of. Never all of the tokens: the
  // last one is always recomputed, so there are logits to sample (as llama-server does).
  PrefixHit get_computed_blocks(const SequenceState& seq) const;

  // Makes room for K/V of tokens [n_computed + hit, n_computed + hit + n_new_tokens) of seq,
  // first taking the blocks of `hit` (only for a sequence with no slots yet); a partial hit
  // plans a BlockCopy into the first fresh block (take_block_copies). Returns the number of
  // blocks newly taken from the pool, or nullopt — changing nothing — when the pool can't
  // supply them; the caller then preempts someone and retries.
  std::optional<int64_t> allocate_slots(const SequenceState& seq, int64_t n_new_tokens,
                                        const PrefixHit& hit = {});

  // The copies planned since the last call, in order. Each source block is referenced until
  // this call, so no allocation could take it; the caller must run the copies before the next
  // allocate_slots (the engine: in the step they were planned for, before its forward pass).
  std::vector<BlockCopy> take_block_copies();

  // Registers the sequence's full blocks whose tokens are all computed in the prefix cache,
  // and its computed rows of a partly filled last block as a partial block (called after each
  // step that advanced n_computed_tokens).
  void cache_computed_blocks(const SequenceState& seq);

  // With a window: releases the sequence's blocks whose positions all lie before the window of
  // its next position (n_computed_tokens), i.e. below n_computed_tokens - window + 1; their
  // table entries become kNoBlock. Call after cache_computed_blocks: a released block that is
  // cached stays in the prefix cache as evictable (its K/V rows are still those of its prefix,
  // so a later prompt may take it), one that is not goes back to the free list. Only the
  // reference of this sequence is dropped; others sharing the block keep it.
  void release_outside_window(const SequenceState& seq);

  // Keeps the blocks that hold the first n_tokens positions of the sequence and releases the
  // rest (blocks taken for speculative drafts that were rejected). Those blocks hold no
  // computed token, so none is cached. Unknown ids are ignored.
  void trim(SequenceId id, int64_t n_tokens);

  // Drops the sequence's references; its cached blocks stay cached (evictable once nobody
  // references them). Returns false for an unknown id (never allocated, or already freed).
  bool free(SequenceId id);

  bool has(SequenceId id) const { return tables_.contains(id); }
  // The sequence's block table (empty for an unknown id); valid until its next allocation/free.
  std::span<const BlockId> block_table(SequenceId id) const;
  // Cache slot (block * block_size + offset) of token position pos, which must have a slot (not
  // one released outside the window).
  int64_t slot(SequenceId id, int64_t pos) const;
  // out[n] = slots of positions [start, start + n).
  void slot_mapping(SequenceId id, int64_t start, int64_t n, int64_t* out) const;

  double usage() const { return pool_.usage(); }  // fraction of blocks referenced
  // Tokens looked up in / served by the prefix cache, summed over the first allocation of each
  // sequence (a preempted sequence's resumption counts again).
  int64_t n_prefix_query_tokens() const { return n_prefix_query_tokens_; }
  int64_t n_prefix_hit_tokens() const { return n_prefix_hit_tokens_; }

  const BlockPool& pool() const { return pool_; }
  // Pool invariants, plus: each block's refcount equals the number of tables that hold it.
  void check_invariants() const;

 private:
  struct Table {
    std::vector<BlockId> blocks;    // [ceil(n_slots / block_size)]; kNoBlock where released
    std::vector<PrefixLink> links;  // chain links of the leading cached blocks (a prefix of blocks)
    bool caching_stopped = false;   // a link could not be made; later blocks stay uncached
    int64_t n_released = 0;         // leading blocks released outside the window
  };

  const Table& table(SequenceId id) const;

  // Blocks of the table, without the released entries.
  static std::vector<BlockId> held_blocks(std::span<const BlockId> blocks);

  BlockPool pool_;
  bool prefix_caching_;
  int64_t window_;
  std::unordered_map<SequenceId, Table> tables_;
  std::vector<BlockCopy> pending_copies_;  // planned by allocate_slots; their sources referenced
  int64_t n_prefix_query_tokens_ = 0;
  int64_t n_prefix_hit_tokens_ = 0;
};

}  // namespace ember
