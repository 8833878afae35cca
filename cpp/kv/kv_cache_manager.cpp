// kv/kv_cache_manager.cpp: block tables and prefix hits per sequence, over a BlockPool.
#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "core/error.h"

namespace ember {

int64_t KVCacheConfig::blocks_for_tokens(int64_t n_tokens, int block_size) {
  if (block_size < 1) throw InvalidArgument(cat("[kv] block_size must be >= 1, got ", block_size));
  return std::max<int64_t>(1, n_tokens / block_size);
}

int64_t KVCacheConfig::blocks_for_bytes(int64_t n_bytes, int64_t bytes_per_token, int block_size) {
  if (bytes_per_token < 1)
    throw InvalidArgument(cat("[kv] bytes_per_token must be >= 1, got ", bytes_per_token));
  return blocks_for_tokens(n_bytes / bytes_per_token, block_size);
}

KVCacheManager::KVCacheManager(const KVCacheConfig& config)
    : pool_(config.n_blocks, config.block_size),
      disk_(config.disk),
      prefix_caching_(config.prefix_caching),
      window_(config.window) {
  if (window_ < 0) throw InvalidArgument(cat("[kv] window must be >= 0, got ", window_));
  if (disk_ && disk_->layout().block_size != config.block_size) {
    throw InvalidArgument(cat("[kv] the disk cache holds blocks of ", disk_->layout().block_size,
                              " tokens, the pool's have ", config.block_size));
  }
}

std::vector<BlockId> KVCacheManager::held_blocks(std::span<const BlockId> blocks) {
  std::vector<BlockId> held;
  for (BlockId b : blocks) {
    if (b != kNoBlock) held.push_back(b);
  }
  return held;
}

const KVCacheManager::Table& KVCacheManager::table(SequenceId id) const {
  const auto it = tables_.find(id);
  if (it == tables_.end()) throw std::logic_error(cat("[kv] sequence ", id, " has no block table"));
  return it->second;
}

PrefixHit KVCacheManager::get_computed_blocks(const SequenceState& seq) const {
  PrefixHit hit;
  if (!prefix_caching_ || seq.n_computed_tokens != 0 || tables_.contains(seq.id)) return hit;
  const int64_t bs = block_size();
  // At most n - 1 tokens: the last token's row must run to produce logits.
  const int64_t max_blocks = (static_cast<int64_t>(seq.tokens.size()) - 1) / bs;
  PrefixLink parent = root_link(seq.cache_namespace);
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto link = pool_.find_cached(parent, seq.tokens.subspan(i * bs, bs));
    if (!link) break;
    hit.links_.push_back(*link);
    parent = *link;
  }
  // The disk tier: the blocks after the memory chain whose files hold them.
  if (disk_) {
    std::unordered_map<BlockHash, std::shared_ptr<const std::vector<uint8_t>>> reads;
    BlockHash parent_hash = pool_.hash_of(parent);
    for (int64_t i = static_cast<int64_t>(hit.links_.size()); i < max_blocks; ++i) {
      const auto tokens = seq.tokens.subspan(i * bs, bs);
      const BlockHash hash = pool_.hash_after(parent_hash, tokens);
      std::shared_ptr<const std::vector<uint8_t>> payload;
      if (const auto it = disk_reads_.find(hash); it != disk_reads_.end()) {
        payload = it->second;
      } else if (auto read = disk_->read(hash, parent_hash, tokens)) {
        payload = std::make_shared<const std::vector<uint8_t>>(std::move(*read));
      } else {
        break;
      }
      reads.emplace(hash, payload);
      hit.loads_.push_back(std::move(payload));
      parent_hash = hash;
    }
    disk_reads_ = std::move(reads);
    hit.n_disk_tokens_ = static_cast<int64_t>(hit.loads_.size()) * bs;
    if (!hit.loads_.empty()) {
      hit.n_tokens_ = static_cast<int64_t>(hit.links_.size()) * bs + hit.n_disk_tokens_;
      return hit;
    }
  }
  const int64_t n_full = static_cast<int64_t>(hit.links_.size()) * bs;
  // The next tokens, up to a block and short of the last token: the rows a copy may give.
  const int64_t n_rest = std::min<int64_t>(bs, static_cast<int64_t>(seq.tokens.size()) - 1 - n_full);
  if (n_rest > 0) {
    if (const auto match = pool_.find_longest_prefix(parent, seq.tokens.subspan(n_full, n_rest))) {
      hit.partial_ = match->link;
      hit.n_partial_ = match->n_tokens;
    }
  }
  hit.n_tokens_ = n_full + hit.n_partial_;
  return hit;
}

std::optional<int64_t> KVCacheManager::allocate_slots(const SequenceState& seq, int64_t n_new_tokens,
                                                      const PrefixHit& hit) {
  const int64_t bs = block_size();
  const auto it = tables_.find(seq.id);
  const bool is_new = it == tables_.end();
  if (!hit.links_.empty() && (!is_new || seq.n_computed_tokens != 0)) {
    throw std::logic_error(
        cat("[kv] sequence ", seq.id, ": a prefix hit is only for a sequence without slots"));
  }
  if (n_new_tokens < 0)
    throw std::logic_error(cat("[kv] sequence ", seq.id, ": ", n_new_tokens, " new tokens"));
  const int64_t n_slots = seq.n_computed_tokens + hit.n_tokens() + n_new_tokens;
  const int64_t n_have = is_new ? 0 : static_cast<int64_t>(it->second.blocks.size());
  const int64_t n_hit_blocks = static_cast<int64_t>(hit.links_.size());
  const int64_t n_need = std::max<int64_t>(0, (n_slots + bs - 1) / bs - n_have - n_hit_blocks);

  // Hit blocks nobody references are counted as allocatable; taking them uses that room up.
  int64_t n_hit_evictable = 0;
  for (const PrefixLink& link : hit.links_) {
    if (!pool_.is_cached(link)) throw std::logic_error(cat("[kv] sequence ", seq.id, ": a stale prefix hit"));
    n_hit_evictable += pool_.ref_count(link.block) == 0;
  }
  if (hit.has_partial()) {
    if (!pool_.is_cached(hit.partial_) || pool_.n_cached_tokens(hit.partial_.block) < hit.n_partial_) {
      throw std::logic_error(cat("[kv] sequence ", seq.id, ": a stale partial prefix hit"));
    }
    n_hit_evictable += pool_.ref_count(hit.partial_.block) == 0;
  }
  if (n_need > pool_.n_allocatable() - n_hit_evictable) return std::nullopt;

  for (const PrefixLink& link : hit.links_) pool_.ref(link.block);
  // The copy's source stays referenced until take_block_copies(), so no allocation evicts it.
  if (hit.has_partial()) pool_.ref(hit.partial_.block);
  auto fresh = pool_.allocate(n_need);  // can't fail: checked above
  // n_need >= 1 with a partial hit: its rows lie past the shared blocks.
  if (hit.has_partial()) pending_copies_.push_back({hit.partial_.block, fresh->front(), hit.n_partial_});
  // The disk blocks are the first fresh ones: they come right after the shared blocks.
  for (size_t i = 0; i < hit.loads_.size(); ++i) pending_loads_.push_back({(*fresh)[i], hit.loads_[i]});
  if (!hit.loads_.empty()) disk_reads_.clear();
  Table& t = is_new ? tables_[seq.id] : it->second;
  for (const PrefixLink& link : hit.links_) {
    t.blocks.push_back(link.block);
    t.links.push_back(link);
  }
  t.blocks.insert(t.blocks.end(), fresh->begin(), fresh->end());
  if (is_new && prefix_caching_) {
    n_prefix_query_tokens_ += static_cast<int64_t>(seq.tokens.size());
    n_prefix_hit_tokens_ += hit.n_tokens();
    n_disk_hit_tokens_ += hit.n_disk_tokens();
  }
  return n_need;
}

std::vector<BlockCopy> KVCacheManager::take_block_copies() {
  std::vector<BlockCopy> copies = std::exchange(pending_copies_, {});
  for (const BlockCopy& c : copies) pool_.release(std::span<const BlockId>(&c.src, 1));
  return copies;
}

void KVCacheManager::cache_computed_blocks(const SequenceState& seq) {
  if (!prefix_caching_) return;
  const auto it = tables_.find(seq.id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const int64_t bs = block_size();
  const int64_t n_computed = std::min<int64_t>(seq.n_computed_tokens,
                                               static_cast<int64_t>(seq.tokens.size()));
  const int64_t n_full = std::min<int64_t>(n_computed / bs, static_cast<int64_t>(t.blocks.size()));
  for (int64_t i = static_cast<int64_t>(t.links.size()); i < n_full && !t.caching_stopped; ++i) {
    if (t.blocks[i] == kNoBlock) {  // released before it could be cached
      t.caching_stopped = true;
      break;
    }
    const PrefixLink parent = i == 0 ? root_link(seq.cache_namespace) : t.links[i - 1];
    const auto link = pool_.cache(t.blocks[i], parent, seq.tokens.subspan(i * bs, bs));
    if (link) {
      const BlockHash hash = pool_.hash_of(*link);
      if (disk_ && link->block == t.blocks[i] && !disk_->contains(hash)) {
        const auto tokens = seq.tokens.subspan(i * bs, bs);
        pending_saves_.push_back(
            {t.blocks[i], hash, pool_.hash_of(parent), std::vector<int32_t>(tokens.begin(), tokens.end())});
      }
      t.links.push_back(*link);
    } else {
      t.caching_stopped = true;
    }
  }
  // The computed head of the next block, after an unbroken chain: a partial block others copy.
  const int64_t n_head = n_computed - n_full * bs;
  if (n_head > 0 && !t.caching_stopped && static_cast<int64_t>(t.links.size()) == n_full &&
      n_full < static_cast<int64_t>(t.blocks.size()) && t.blocks[n_full] != kNoBlock) {
    const PrefixLink parent = n_full == 0 ? root_link(seq.cache_namespace) : t.links[n_full - 1];
    pool_.cache_partial(t.blocks[n_full], parent, seq.tokens.subspan(n_full * bs, n_head));
  }
}

std::vector<BlockId> KVCacheManager::cached_prefix(std::span<const int32_t> tokens) const {
  std::vector<BlockId> blocks;
  const int64_t bs = block_size();
  PrefixLink parent;
  for (int64_t i = 0; (i + 1) * bs <= static_cast<int64_t>(tokens.size()); ++i) {
    const auto link = pool_.find_cached(parent, tokens.subspan(i * bs, bs));
    if (!link) break;
    blocks.push_back(link->block);
    parent = *link;
  }
  return blocks;
}

int64_t KVCacheManager::adopt_prefix(std::span<const int32_t> tokens, int64_t n_blocks,
                                     std::vector<std::pair<int64_t, BlockId>>& to_write,
                                     std::vector<BlockId>& held) {
  const int64_t bs = block_size();
  n_blocks = std::min<int64_t>(n_blocks, static_cast<int64_t>(tokens.size()) / bs);
  PrefixLink parent;
  int64_t i = 0;
  for (; i < n_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    std::optional<PrefixLink> link = pool_.find_cached(parent, block_tokens);
    if (link) {
      pool_.ref(link->block);  // held, so the blocks allocated after it cannot evict it
      held.push_back(link->block);
    } else {
      auto fresh = pool_.allocate(1);
      if (!fresh) break;
      held.push_back(fresh->front());
      link = pool_.cache(fresh->front(), parent, block_tokens);
      if (!link) break;
      if (link->block == fresh->front()) to_write.emplace_back(i, fresh->front());
    }
    parent = *link;
  }
  std::ranges::reverse(held);  // released back to front, as free() does
  return i;
}

void KVCacheManager::release_outside_window(const SequenceState& seq) {
  if (window_ <= 0) return;
  const auto it = tables_.find(seq.id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const int64_t bs = block_size();
  const int64_t first_needed = seq.n_computed_tokens - window_ + 1;  // the next position's first key
  const int64_t n_outside = std::min<int64_t>(std::max<int64_t>(0, first_needed) / bs,
                                              static_cast<int64_t>(t.blocks.size()));
  std::vector<BlockId> released;
  for (int64_t i = n_outside - 1; i >= t.n_released; --i) {  // back to front, as free() does
    released.push_back(t.blocks[i]);
    t.blocks[i] = kNoBlock;
  }
  t.n_released = std::max(t.n_released, n_outside);
  pool_.release(released);
}

void KVCacheManager::trim(SequenceId id, int64_t n_tokens) {
  const auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const int64_t n_keep = (std::max<int64_t>(0, n_tokens) + block_size() - 1) / block_size();
  if (n_keep >= static_cast<int64_t>(t.blocks.size())) return;
  if (n_keep < static_cast<int64_t>(t.links.size())) {
    throw std::logic_error(
        cat("[kv] sequence ", id, ": trimming to ", n_tokens, " tokens would drop a cached block"));
  }
  std::vector<BlockId> tail = held_blocks(std::vector<BlockId>(t.blocks.rbegin(), t.blocks.rend() - n_keep));
  t.blocks.resize(static_cast<size_t>(n_keep));
  t.n_released = std::min(t.n_released, n_keep);
  pool_.release(tail);
}

bool KVCacheManager::free(SequenceId id) {
  const auto it = tables_.find(id);
  if (it == tables_.end()) return false;
  // Back to front: the tail of a sequence is the least shareable, so it becomes evictable first.
  std::vector<BlockId> reversed = held_blocks(
      std::vector<BlockId>(it->second.blocks.rbegin(), it->second.blocks.rend()));
  tables_.erase(it);
  pool_.release(reversed);
  return true;
}

std::span<const BlockId> KVCacheManager::block_table(SequenceId id) const {
  const auto it = tables_.find(id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

int64_t KVCacheManager::slot(SequenceId id, int64_t pos) const {
  const Table& t = table(id);
  const int64_t bs = block_size();
  if (pos < 0 || pos / bs >= static_cast<int64_t>(t.blocks.size()) || t.blocks[pos / bs] == kNoBlock) {
    throw std::logic_error(cat("[kv] sequence ", id, ": position ", pos, " has no slot (", t.blocks.size(),
                               " blocks, ", t.n_released, " released outside the window)"));
  }
  return int64_t{t.blocks[pos / bs]} * bs + pos % bs;
}

void KVCacheManager::slot_mapping(SequenceId id, int64_t start, int64_t n, int64_t* out) const {
  const Table& t = table(id);
  const int64_t bs = block_size();
  if (start < 0 || n < 0 || (start + n + bs - 1) / bs > static_cast<int64_t>(t.blocks.size()) ||
      (n > 0 && start / bs < t.n_released)) {
    throw std::logic_error(cat("[kv] sequence ", id, ": positions [", start, ", ", start + n,
                               ") have no slots (", t.blocks.size(), " blocks)"));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = start + i;
    out[i] = int64_t{t.blocks[pos / bs]} * bs + pos % bs;
  }
}

void KVCacheManager::check_invariants() const {
  pool_.check_invariants();
  std::vector<int32_t> refs(pool_.n_blocks(), 0);
  for (const auto& [id, t] : tables_) {
    if (t.links.size() > t.blocks.size()) {
      throw std::logic_error(cat("[kv] invariant broken: sequence ", id, " has more links than blocks"));
    }
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      if ((t.blocks[i] == kNoBlock) != (static_cast<int64_t>(i) < t.n_released)) {
        throw std::logic_error(cat("[kv] invariant broken: sequence ", id, " block ", i, " is ", t.blocks[i],
                                   " with ", t.n_released, " released"));
      }
      if (t.blocks[i] != kNoBlock) ++refs.at(t.blocks[i]);
    }
  }
  for (const BlockCopy& c : pending_copies_) ++refs.at(c.src);
  for (BlockId b = 0; b < pool_.n_blocks(); ++b) {
    if (refs[b] != pool_.ref_count(b)) {
      throw std::logic_error(cat("[kv] invariant broken: block ", b, " is in ", refs[b],
                                 " tables, has ref_count ", pool_.ref_count(b)));
    }
  }
}

}  // namespace ember
