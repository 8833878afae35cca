// tests/cpp/test_block_pool.cpp: the block hash chain and the BlockPool — refcounts, the
// prefix-cache lookup (exact even when hashes collide) and LRU eviction of released blocks.
#include <bit>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "fake_runner.h"
#include "harness.h"
#include "kv/block_pool.h"

using namespace ember;

namespace {

TEST(block_hash_is_chained_and_well_mixed) {
  const auto a = iota_tokens(16, 0), b = iota_tokens(16, 1);
  CHECK_EQ(hash_block(kRootBlockHash, a), hash_block(kRootBlockHash, a));
  CHECK(hash_block(kRootBlockHash, a) != hash_block(kRootBlockHash, b));
  CHECK(hash_block(kRootBlockHash, a) != hash_block(hash_block(kRootBlockHash, a), a));
  // Flipping one token flips about half of the 64 bits (avalanche), over many trials.
  std::mt19937 rng(7);
  int64_t n_bits = 0, n_trials = 2000;
  std::set<BlockHash> seen;
  for (int i = 0; i < n_trials; ++i) {
    std::vector<int32_t> t(16);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 50000);
    const BlockHash h0 = hash_block(kRootBlockHash, t);
    seen.insert(h0);
    t[rng() % 16] ^= 1 << (rng() % 16);
    n_bits += std::popcount(h0 ^ hash_block(kRootBlockHash, t));
  }
  const double mean = static_cast<double>(n_bits) / n_trials;
  CHECK(mean > 30.0 && mean < 34.0);
  CHECK_EQ(static_cast<int64_t>(seen.size()), n_trials);
}

TEST(pool_allocate_release_refcounts) {
  BlockPool pool(4, 16);
  CHECK_EQ(pool.n_allocatable(), 4);
  auto a = pool.allocate(3);
  CHECK(a.has_value());
  CHECK_EQ((*a)[0], 0);
  CHECK_EQ(pool.n_allocatable(), 1);
  CHECK(!pool.allocate(2).has_value());  // all or nothing
  CHECK_EQ(pool.n_allocatable(), 1);
  CHECK(pool.usage() == 0.75);
  pool.release(*a);
  CHECK_EQ(pool.n_allocatable(), 4);
  CHECK_EQ(pool.ref_count((*a)[0]), 0);
  // A double free is caught, not turned into a negative refcount.
  CHECK_THROWS(std::logic_error, pool.release(std::span<const BlockId>(a->data(), 1)), "double free");
  CHECK_EQ(pool.ref_count((*a)[0]), 0);
  pool.check_invariants();
  CHECK_THROWS(InvalidArgument, BlockPool(0, 16), "blocks");
  CHECK_THROWS(InvalidArgument, BlockPool(4, 0), "block_size");
}

TEST(pool_prefix_cache_lookup_is_exact) {
  BlockPool pool(8, 4);
  const std::vector<int32_t> t0{1, 2, 3, 4}, t1{5, 6, 7, 8};
  auto b = *pool.allocate(2);
  const auto l0 = pool.cache(b[0], PrefixLink{}, t0);
  CHECK(l0 && l0->block == b[0]);
  const auto l1 = pool.cache(b[1], *l0, t1);
  CHECK(l1 && l1->block == b[1]);
  CHECK(pool.find_cached(PrefixLink{}, t0) == l0);
  CHECK(pool.find_cached(*l0, t1) == l1);
  CHECK(!pool.find_cached(PrefixLink{}, t1));  // same tokens, other parent: a miss
  CHECK(!pool.find_cached(*l0, t0));
  // The same prefix computed again in another block is shared, not cached twice.
  auto c = *pool.allocate(1);
  CHECK(pool.cache(c[0], PrefixLink{}, t0) == l0);
  CHECK(!pool.is_cached(c[0]));
  pool.release(c);
  CHECK_EQ(pool.n_free(), 6);
  pool.release(b);
  CHECK_EQ(pool.n_evictable(), 2);
  CHECK(pool.find_cached(PrefixLink{}, t0) == l0);  // unreferenced but still cached
  pool.check_invariants();
}

// Every key collides: lookups must still compare tokens and parents, so distinct prefixes are
// misses (never someone else's K/V), and only one of them can be cached at a time.
BlockHash colliding_hash(BlockHash, std::span<const int32_t>) { return 42; }

TEST(pool_hash_collisions_cannot_corrupt) {
  BlockPool pool(8, 4, colliding_hash);
  const std::vector<int32_t> t0{1, 2, 3, 4}, t1{9, 9, 9, 9};
  auto b = *pool.allocate(2);
  const auto l0 = pool.cache(b[0], PrefixLink{}, t0);
  CHECK(l0.has_value());
  CHECK(!pool.cache(b[1], PrefixLink{}, t1).has_value());  // the hash is taken by another prefix
  CHECK(!pool.find_cached(PrefixLink{}, t1).has_value());
  CHECK(pool.find_cached(PrefixLink{}, t0) == l0);
  pool.release(b);
  pool.check_invariants();
}

TEST(pool_evicts_least_recently_released_first) {
  BlockPool pool(4, 2);
  const std::vector<std::vector<int32_t>> t{{1, 1}, {2, 2}, {3, 3}, {4, 4}};
  auto b = *pool.allocate(4);
  std::vector<PrefixLink> links;
  for (int i = 0; i < 4; ++i) links.push_back(*pool.cache(b[i], PrefixLink{}, t[i]));
  // Release in the order 2, 0, 3, 1: that is the eviction order.
  for (int i : {2, 0, 3, 1}) pool.release(std::span<const BlockId>(&b[i], 1));
  CHECK(pool.evictable_blocks() == (std::vector<BlockId>{b[2], b[0], b[3], b[1]}));
  // A hit on block 0 takes it off the LRU list; released again, it becomes the most recent.
  pool.ref(b[0]);
  pool.release(std::span<const BlockId>(&b[0], 1));
  CHECK(pool.evictable_blocks() == (std::vector<BlockId>{b[2], b[3], b[1], b[0]}));
  auto first = *pool.allocate(1);
  CHECK_EQ(first[0], b[2]);
  CHECK(!pool.find_cached(PrefixLink{}, t[2]).has_value());
  CHECK(!pool.is_cached(links[2]));  // the old link dies with the eviction
  auto two = *pool.allocate(2);
  CHECK(two == (std::vector<BlockId>{b[3], b[1]}));
  CHECK(pool.find_cached(PrefixLink{}, t[0]) == links[0]);
  pool.check_invariants();
}

TEST(pool_partial_blocks_match_the_longest_common_prefix) {
  BlockPool pool(8, 4);
  auto b = *pool.allocate(4);
  const auto root = *pool.cache(b[0], PrefixLink{}, std::vector<int32_t>{1, 2, 3, 4});
  // After it: a full block 5 6 7 8, and two partial ones, 5 6 9 and 5.
  const auto full = *pool.cache(b[1], root, std::vector<int32_t>{5, 6, 7, 8});
  CHECK(pool.cache_partial(b[2], root, std::vector<int32_t>{5, 6}));
  CHECK(pool.cache_partial(b[2], root, std::vector<int32_t>{5, 6, 9}));  // its owner appended
  CHECK(pool.cache_partial(b[3], root, std::vector<int32_t>{5}));
  CHECK_EQ(pool.n_partial(), 2);
  CHECK_EQ(pool.n_cached(), 2);
  CHECK_EQ(pool.n_cached_tokens(b[2]), 3);
  const auto m1 = pool.find_longest_prefix(root, std::vector<int32_t>{5, 6, 9, 1});
  CHECK(m1 && m1->link.block == b[2] && m1->n_tokens == 3);
  const auto m2 = pool.find_longest_prefix(root, std::vector<int32_t>{5, 6, 7});
  CHECK(m2 && m2->link == full && m2->n_tokens == 3);
  CHECK(!pool.find_longest_prefix(root, std::vector<int32_t>{6}).has_value());
  CHECK(!pool.find_longest_prefix(PrefixLink{}, std::vector<int32_t>{5, 6}).has_value());  // other parent
  // A partial block is never the target of a full-block lookup.
  CHECK(!pool.find_cached(root, std::vector<int32_t>{5, 6, 9, 0}).has_value());
  // Other tokens than its own are a bug of the caller.
  CHECK_THROWS(std::logic_error, pool.cache_partial(b[3], root, std::vector<int32_t>{7, 7}), "other tokens");
  // Filled, it becomes a full block; when the same full block is cached already it is dropped.
  const auto filled = pool.cache(b[2], root, std::vector<int32_t>{5, 6, 9, 9});
  CHECK(filled && filled->block == b[2]);
  CHECK_EQ(pool.n_partial(), 1);
  CHECK(pool.cache(b[3], root, std::vector<int32_t>{5, 6, 7, 8}) == full);
  CHECK(!pool.is_cached(b[3]));
  CHECK_EQ(pool.n_partial(), 0);
  pool.check_invariants();
  // Released, partial blocks are evictable like full ones, and eviction drops them.
  auto c = *pool.allocate(1);
  CHECK(pool.cache_partial(c[0], full, std::vector<int32_t>{1}));
  pool.release(c);
  pool.release(b);
  CHECK_EQ(pool.n_evictable(), 4);
  CHECK(pool.find_longest_prefix(full, std::vector<int32_t>{1, 2}).has_value());
  auto all = *pool.allocate(8);
  CHECK_EQ(pool.n_partial(), 0);
  CHECK(!pool.find_longest_prefix(full, std::vector<int32_t>{1, 2}).has_value());
  pool.release(all);
  pool.check_invariants();
}

TEST(pool_stale_parent_link_never_matches) {
  BlockPool pool(2, 2);
  auto b = *pool.allocate(2);
  const auto p = *pool.cache(b[0], PrefixLink{}, std::vector<int32_t>{1, 1});
  const auto c = *pool.cache(b[1], p, std::vector<int32_t>{2, 2});
  pool.release(std::vector<BlockId>{b[1], b[0]});  // b[1] is evicted first
  // Evict both, then re-cache block b[0]'s id with other contents: the old child link is dead.
  auto again = *pool.allocate(2);
  CHECK(!pool.is_cached(p) && !pool.is_cached(c));
  const auto p2 = *pool.cache(again[1], PrefixLink{}, std::vector<int32_t>{7, 7});
  CHECK(!pool.find_cached(p2, std::vector<int32_t>{2, 2}).has_value());
  CHECK(!pool.cache(again[0], p, std::vector<int32_t>{2, 2}).has_value());  // parent gone
  pool.release(again);
  pool.check_invariants();
}

}  // namespace
