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
//
// With a DiskCache (KVCacheConfig::disk), the prefix cache has a second tier: a new sequence's
// hit goes on, past the blocks found in memory, with the blocks whose files the disk holds
// (read and checked here, loaded into fresh blocks by the runner before the step: BlockLoad),
// and every block newly registered full is handed out to be written there (BlockSave).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/disk_cache.h"

namespace ember {

using SequenceId = int64_t;

struct KVCacheConfig {
  int block_size = 0;    // tokens per block, >= 1 (the engine's default: EngineOptions::block_size)
  int64_t n_blocks = 0;  // blocks in the pool (see blocks_for_tokens / blocks_for_bytes)
  bool prefix_caching = true;
  // > 0: every layer attends over the last `window` positions only (a sliding window on all
  // layers), so blocks wholly before a sequence's window can be released as it advances.
  int64_t window = 0;
  // Not null: full blocks also live in files there (see the top of this file).
  std::shared_ptr<DiskCache> disk;

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

// A block's K/V read from the disk cache, to write into block dst (every layer, all its slots)
// before a step's forward pass; the payload's layout is the runner's (ModelRunner::read_block).
struct BlockLoad {
  BlockId dst = kNoBlock;
  std::shared_ptr<const std::vector<uint8_t>> payload;
};

// A block newly registered full in the prefix cache, whose K/V should go to the disk cache.
struct BlockSave {
  BlockId block = kNoBlock;
  BlockHash hash = 0;
  BlockHash parent_hash = 0;
  std::vector<int32_t> tokens;  // [block_size]
};

// The cached prefix get_computed_blocks() found for a new sequence, to hand back to
// allocate_slots(): whole shared blocks, then maybe the leading rows of one more cached block
// (full or partial) that the sequence gets a copy of. Callers read its size only; the blocks
// stay the manager's business.
class PrefixHit {
 public:
  int64_t n_tokens() const { return n_tokens_; }
  bool has_partial() const { return n_partial_ > 0; }
  // Tokens of the hit read from the disk cache (whole blocks after those found in memory).
  int64_t n_disk_tokens() const { return n_disk_tokens_; }
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
  // [n_disk_tokens_ / block_size] payloads of the blocks after links_, read from the disk
  // cache (never together with a partial block)
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> loads_;
  int64_t n_disk_tokens_ = 0;
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
  // With a disk cache, the full blocks after those found in memory whose files it holds come
  // next (read here, on the caller's thread: a hit's files are read once, and again only when
  // a lookup for another sequence came between).
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
  // The disk loads planned since the last call (into fresh blocks of new sequences), which the
  // caller must run like the copies.
  std::vector<BlockLoad> take_block_loads() { return std::exchange(pending_loads_, {}); }
  // Blocks registered full since the last call whose files the disk cache lacks (none without
  // one). Their rows stay valid until the next step's forward pass (or copy, or load).
  std::vector<BlockSave> take_block_saves() { return std::exchange(pending_saves_, {}); }
  DiskCache* disk() const { return disk_.get(); }

  // The leading blocks of `tokens` cached full in memory, in order (a prefix chain): what a
  // state file saves.
  std::vector<BlockId> cached_prefix(std::span<const int32_t> tokens) const;
  // Puts the first n_blocks full blocks of `tokens` into the prefix cache (a state file's
  // restore): the returned (block index, block) pairs are fresh, registered blocks whose rows
  // the caller must write at once, then hand back with release_adopted(); the blocks already
  // cached are kept as they are. Returns how many leading blocks are now cached (fewer than
  // n_blocks when the pool ran out).
  int64_t adopt_prefix(std::span<const int32_t> tokens, int64_t n_blocks,
                       std::vector<std::pair<int64_t, BlockId>>& to_write, std::vector<BlockId>& held);
  void release_adopted(std::span<const BlockId> held) { pool_.release(held); }

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
  int64_t n_disk_hit_tokens() const { return n_disk_hit_tokens_; }  // of them, read from disk

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
  std::shared_ptr<DiskCache> disk_;
  // The payloads the last disk lookup read, by hash: the lookup of a request that waits for
  // room repeats every step and must not read its files again.
  mutable std::unordered_map<BlockHash, std::shared_ptr<const std::vector<uint8_t>>> disk_reads_;
  std::vector<BlockLoad> pending_loads_;
  std::vector<BlockSave> pending_saves_;
  bool prefix_caching_;
  int64_t window_;
  std::unordered_map<SequenceId, Table> tables_;
  std::vector<BlockCopy> pending_copies_;  // planned by allocate_slots; their sources referenced
  int64_t n_prefix_query_tokens_ = 0;
  int64_t n_prefix_hit_tokens_ = 0;
  int64_t n_disk_hit_tokens_ = 0;
};

}  // namespace ember
