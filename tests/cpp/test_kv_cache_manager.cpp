// tests/cpp/test_kv_cache_manager.cpp: the KVCacheManager over its block pool — prefix hits in
// full blocks and rows copied from partial ones, all-or-nothing allocation, eviction order, KV
// budgets — and the PagedKVCache memory it hands out, through the CPU backend's store_kv,
// copy_kv and attention.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "backend.h"
#include "cpu/backend_cpu.h"
#include "fake_runner.h"
#include "harness.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_kv_cache.h"

using namespace ember;

namespace {

// Sequences of another namespace (a LoRA adapter, or another scale of it) hold other K/V for the
// same tokens: they never hit each other's blocks, full or partial; in their own namespace they do.
TEST(manager_prefix_namespaces_never_share_blocks) {
  KVCacheManager kv(kv_config(64, 16));
  const auto prompt = iota_tokens(40, 1);  // 2 full blocks and 8 rows
  SequenceState a{1, prompt, 0, 0};
  CHECK(kv.allocate_slots(a, 40).has_value());
  a.n_computed_tokens = 40;
  kv.cache_computed_blocks(a);
  const uint64_t adapter = (uint64_t{1} << 32) | 0x3f800000u;  // adapter 0 at scale 1
  SequenceState b{2, prompt, 0, adapter};
  CHECK_EQ(kv.get_computed_blocks(b).n_tokens(), 0);
  CHECK(kv.allocate_slots(b, 40).has_value());
  b.n_computed_tokens = 40;
  kv.cache_computed_blocks(b);
  CHECK_EQ(kv.pool().n_cached(), 4);  // each namespace its own two full blocks
  CHECK_EQ(kv.get_computed_blocks(SequenceState{3, prompt, 0, adapter}).n_tokens(), 39);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, prompt, 0, 0}).n_tokens(), 39);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{5, prompt, 0, adapter + 1}).n_tokens(), 0);
  const auto ta = kv.block_table(1), tb = kv.block_table(2);
  for (int i = 0; i < 3; ++i) CHECK(ta[i] != tb[i]);
  kv.check_invariants();
}

TEST(manager_prefix_hit_counts_full_blocks_and_never_the_whole_prompt) {
  KVCacheManager kv(kv_config(64, 16));
  const auto prompt = iota_tokens(160, 1);  // 10 full blocks
  SequenceState a{1, prompt, 0};
  CHECK_EQ(kv.get_computed_blocks(a).n_tokens(), 0);
  CHECK(kv.allocate_slots(a, 160) == std::optional<int64_t>(10));
  a.n_computed_tokens = 160;
  kv.cache_computed_blocks(a);
  CHECK_EQ(kv.pool().n_cached(), 10);

  // The same prompt: 9 blocks hit and 15 rows of the 10th copied; its last token is recomputed
  // so that its row gives logits.
  SequenceState b{2, prompt, 0};
  CHECK_EQ(kv.get_computed_blocks(b).n_tokens(), 159);
  // 90% shared (144 of 160 tokens), then different: exactly the 9 shared blocks.
  auto p90 = prompt;
  for (int i = 144; i < 160; ++i) p90[i] = 5000 + i;
  SequenceState c{3, p90, 0};
  const PrefixHit hit = kv.get_computed_blocks(c);
  CHECK_EQ(hit.n_tokens(), 144);
  CHECK(kv.allocate_slots(c, 16, hit) == std::optional<int64_t>(1));
  CHECK_EQ(kv.n_prefix_hit_tokens(), 144);
  CHECK_EQ(kv.n_prefix_query_tokens(), 320);
  const auto ta = kv.block_table(1), tc = kv.block_table(3);
  CHECK(std::equal(ta.begin(), ta.begin() + 9, tc.begin()));
  CHECK(ta[9] != tc[9]);
  for (int i = 0; i < 9; ++i) CHECK_EQ(kv.pool().ref_count(ta[i]), 2);
  // A prompt that is a strict prefix, mid-block: 2 blocks and 7 rows of the 3rd (all but its last).
  const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 40);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, short_prompt, 0}).n_tokens(), 39);
  kv.check_invariants();
  CHECK(kv.free(1) && kv.free(3));
  CHECK(!kv.free(1));
  CHECK_EQ(kv.usage(), 0.0);
  kv.check_invariants();
}

TEST(manager_partial_hit_copies_the_rows_past_the_last_full_block) {
  KVCacheManager kv(kv_config(64, 16));
  const auto prompt = iota_tokens(76, 1);  // 4 full blocks and 12 tokens
  SequenceState a{1, prompt, 0};
  CHECK(kv.allocate_slots(a, 76) == std::optional<int64_t>(5));
  a.n_computed_tokens = 76;
  kv.cache_computed_blocks(a);
  CHECK_EQ(kv.pool().n_cached(), 4);
  CHECK_EQ(kv.pool().n_partial(), 1);
  const BlockId a_last = kv.block_table(1)[4];
  CHECK_EQ(kv.pool().n_cached_tokens(a_last), 12);

  // The same prompt: 4 shared blocks, 11 rows copied from a's partly filled block (the last
  // token must run for its logits): 75 tokens, as llama-server reuses n - 1.
  SequenceState b{2, prompt, 0};
  const PrefixHit hit = kv.get_computed_blocks(b);
  CHECK_EQ(hit.n_tokens(), 75);
  CHECK(hit.has_partial());
  CHECK_EQ(hit.without_partial().n_tokens(), 64);
  CHECK(kv.allocate_slots(b, 1, hit) == std::optional<int64_t>(1));
  const auto tb = kv.block_table(2);
  CHECK_EQ(tb.size(), size_t{5});
  CHECK(std::equal(tb.begin(), tb.begin() + 4, kv.block_table(1).begin()));
  CHECK(tb[4] != a_last);
  CHECK_EQ(kv.pool().ref_count(a_last), 2);  // its owner, and the planned copy
  kv.check_invariants();
  const auto copies = kv.take_block_copies();
  CHECK_EQ(copies.size(), size_t{1});
  CHECK_EQ(copies[0].src, a_last);
  CHECK_EQ(copies[0].dst, tb[4]);
  CHECK_EQ(copies[0].n_slots, 11);
  CHECK_EQ(kv.pool().ref_count(a_last), 1);
  CHECK(kv.take_block_copies().empty());
  CHECK_EQ(kv.n_prefix_hit_tokens(), 75);
  kv.check_invariants();

  // Its owner goes on: the partial block grows, then fills and becomes a full cached block.
  std::vector<int32_t> longer = prompt;
  for (int i = 0; i < 8; ++i) longer.push_back(900 + i);
  a.tokens = longer;
  CHECK(kv.allocate_slots(a, 4) == std::optional<int64_t>(0));
  a.n_computed_tokens = 80;
  kv.cache_computed_blocks(a);
  CHECK_EQ(kv.pool().n_cached(), 5);
  CHECK_EQ(kv.pool().n_partial(), 0);
  // b computes its last token: its copy becomes a partial block of 12 tokens beside a's.
  b.n_computed_tokens = 76;
  kv.cache_computed_blocks(b);
  CHECK_EQ(kv.pool().n_partial(), 1);
  // A prompt that leaves a full block early (71 of a's first 80 tokens) copies from it; a
  // prompt of exactly 80 tokens reuses 79.
  std::vector<int32_t> early(longer.begin(), longer.begin() + 71);
  early.push_back(12345);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{3, early, 0}).n_tokens(), 71);
  const std::vector<int32_t> eighty(longer.begin(), longer.begin() + 80);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, eighty, 0}).n_tokens(), 79);
  // Freed, a partial block stays cached (evictable) for later prompts.
  CHECK(kv.free(2));
  CHECK_EQ(kv.pool().n_partial(), 1);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{5, prompt, 0}).n_tokens(), 75);
  CHECK(kv.free(1));
  CHECK_EQ(kv.usage(), 0.0);
  kv.check_invariants();
  // Without prefix caching nothing is shared, nor copied.
  KVCacheManager off(kv_config(64, 16, /*prefix_caching=*/false));
  SequenceState c{1, prompt, 0};
  CHECK(off.allocate_slots(c, 76).has_value());
  c.n_computed_tokens = 76;
  off.cache_computed_blocks(c);
  CHECK_EQ(off.get_computed_blocks(SequenceState{2, prompt, 0}).n_tokens(), 0);
  CHECK_EQ(off.pool().n_partial(), 0);
}

// The CPU backend's copy_kv moves exactly the leading slots of every head, K and V.
TEST(copy_kv_copies_the_leading_rows_of_every_head) {
  CpuBackend backend(1);
  for (const DType type : {DType::f16, DType::q8_0}) {
    PagedKVCache cache(backend, 2, 2, 32, 4, 8, type);
    std::mt19937 rng(3);
    std::vector<uint8_t> before(cache.k.n_bytes()), before_v(cache.v.n_bytes());
    for (auto& x : before) x = static_cast<uint8_t>(rng());
    for (auto& x : before_v) x = static_cast<uint8_t>(rng());
    std::copy(before.begin(), before.end(), cache.k.as<uint8_t>());
    std::copy(before_v.begin(), before_v.end(), cache.v.as<uint8_t>());
    backend.copy_kv(cache.layer(1, nullptr), 3, 0, 5);
    const KVView view = cache.layer(1, nullptr);
    for (int64_t il = 0; il < 2; ++il) {
      for (int64_t slot = 0; slot < cache.n_slots(); ++slot) {
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t block = slot / 8, pos = slot % 8;
          const int64_t at = il * cache.layer_bytes() + ((block * 2 + h) * 8 + pos) * view.head_bytes;
          const bool copied = il == 1 && block == 0 && pos < 5;
          const int64_t from = copied ? il * cache.layer_bytes() + ((3 * 2 + h) * 8 + pos) * view.head_bytes
                                      : at;
          CHECK(std::equal(before.begin() + from, before.begin() + from + view.head_bytes,
                           cache.k.as<uint8_t>() + at));
          CHECK(std::equal(before_v.begin() + from, before_v.begin() + from + view.head_bytes,
                           cache.v.as<uint8_t>() + at));
        }
      }
    }
  }
}

TEST(manager_allocation_failure_changes_nothing) {
  KVCacheManager kv(kv_config(4, 4));
  const auto prompt = iota_tokens(12, 1);
  SequenceState a{1, prompt, 0};
  CHECK(kv.allocate_slots(a, 12) == std::optional<int64_t>(3));
  SequenceState b{2, iota_tokens(8, 100), 0};
  CHECK(!kv.allocate_slots(b, 8).has_value());
  CHECK(!kv.has(2));
  CHECK(kv.allocate_slots(b, 4) == std::optional<int64_t>(1));
  a.n_computed_tokens = 12;
  CHECK(!kv.allocate_slots(a, 1).has_value());  // the 13th token needs a 5th block
  CHECK_EQ(kv.block_table(1).size(), size_t{3});
  // Slots: position p of a sequence lives at table[p / 4] * 4 + p % 4.
  std::vector<int64_t> slots(12);
  kv.slot_mapping(1, 0, 12, slots.data());
  for (int p = 0; p < 12; ++p) CHECK_EQ(slots[p], int64_t{kv.block_table(1)[p / 4]} * 4 + p % 4);
  kv.check_invariants();
}

TEST(manager_hit_on_evictable_blocks_counts_their_room) {
  // 4 blocks; a cached 3-block prefix (and a partial 4th) nobody references, then a request
  // that hits it and needs 2 more blocks: 4 evictable look like 4, but the hit uses 3 of them
  // and its copy's source the 4th.
  KVCacheManager kv(kv_config(4, 4));
  const auto prompt = iota_tokens(13, 1);
  SequenceState a{1, prompt, 0};
  CHECK(kv.allocate_slots(a, 13).has_value());
  a.n_computed_tokens = 13;
  kv.cache_computed_blocks(a);
  kv.free(1);
  auto longer = iota_tokens(24, 1);
  SequenceState b{2, longer, 0};
  const PrefixHit hit = kv.get_computed_blocks(b);
  CHECK_EQ(hit.n_tokens(), 13);                      // 3 blocks and 1 row of the 4th
  CHECK(!kv.allocate_slots(b, 3, hit).has_value());  // 1 block needed, none left
  const PrefixHit full = hit.without_partial();
  CHECK_EQ(full.n_tokens(), 12);
  CHECK(!kv.allocate_slots(b, 12, full).has_value());  // needs 3 more blocks, 1 is left
  CHECK(kv.allocate_slots(b, 4, full) == std::optional<int64_t>(1));
  CHECK(kv.take_block_copies().empty());
  kv.check_invariants();
}

TEST(manager_evicts_sequence_tails_first_and_older_sequences_first) {
  KVCacheManager kv(kv_config(6, 4));
  const auto pa = iota_tokens(12, 1), pb = iota_tokens(12, 100);
  for (auto [id, prompt] : {std::pair{SequenceId{1}, &pa}, std::pair{SequenceId{2}, &pb}}) {
    CHECK(kv.allocate_slots(SequenceState{id, *prompt, 0}, 12).has_value());
    kv.cache_computed_blocks(SequenceState{id, *prompt, 12});
  }
  const std::vector<BlockId> a(kv.block_table(1).begin(), kv.block_table(1).end());
  const std::vector<BlockId> b(kv.block_table(2).begin(), kv.block_table(2).end());
  kv.free(1);
  kv.free(2);
  CHECK(kv.pool().evictable_blocks() == (std::vector<BlockId>{a[2], a[1], a[0], b[2], b[1], b[0]}));
  // Two new blocks evict A's tail; A's first block survives, B is intact.
  CHECK(kv.allocate_slots(SequenceState{3, iota_tokens(8, 900), 0}, 8).has_value());
  auto longer_a = pa;
  longer_a.push_back(7);
  auto longer_b = pb;
  longer_b.push_back(7);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, longer_a, 0}).n_tokens(), 4);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, longer_b, 0}).n_tokens(), 12);
  kv.check_invariants();
}

TEST(manager_releases_blocks_behind_the_window) {
  // Window 40, blocks of 16: the next position p attends to p - 39 .. p, so once 100 tokens are
  // computed blocks 0..2 (positions 0..47 < 61) are behind it, block 3 (48..63) is not.
  KVCacheConfig config = kv_config(16, 16);
  config.window = 40;
  KVCacheManager kv(config);
  const auto prompt = iota_tokens(100, 1);
  SequenceState a{1, prompt, 0};
  CHECK(kv.allocate_slots(a, 100) == std::optional<int64_t>(7));
  const std::vector<BlockId> before(kv.block_table(1).begin(), kv.block_table(1).end());
  // A second sequence shares a's first 4 blocks through the prefix cache.
  a.n_computed_tokens = 100;
  kv.cache_computed_blocks(a);
  SequenceState b{2, prompt, 0};
  const PrefixHit hit = kv.get_computed_blocks(b);
  CHECK_EQ(hit.n_tokens(), 99);  // and 3 rows copied from a's 7th block
  CHECK(kv.allocate_slots(b, 1, hit) == std::optional<int64_t>(1));
  CHECK_EQ(kv.take_block_copies().size(), size_t{1});
  kv.release_outside_window(a);
  const auto table = kv.block_table(1);
  CHECK_EQ(table.size(), size_t{7});
  for (int i = 0; i < 3; ++i) CHECK_EQ(table[i], kNoBlock);
  for (int i = 3; i < 7; ++i) CHECK_EQ(table[i], before[i]);
  // Only a's reference went: b still holds blocks 0..2, whose rows stay cached for it.
  for (int i = 0; i < 3; ++i) CHECK_EQ(kv.pool().ref_count(before[i]), 1);
  std::vector<int64_t> slots(52);
  kv.slot_mapping(1, 48, 52, slots.data());  // the window's positions keep their slots
  CHECK_EQ(slots[0], int64_t{before[3]} * 16);
  kv.check_invariants();
  // Releasing again changes nothing; b's own release drops the last references: the cached
  // blocks become evictable, not free (a later prompt may still take them).
  kv.release_outside_window(a);
  b.n_computed_tokens = 100;
  kv.cache_computed_blocks(b);
  kv.release_outside_window(b);
  for (int i = 0; i < 3; ++i) CHECK_EQ(kv.pool().ref_count(before[i]), 0);
  CHECK_EQ(kv.pool().n_evictable(), 3);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{3, prompt, 0}).n_tokens(), 99);
  kv.check_invariants();

  // The room is reusable: of 16 blocks a and b still hold 5 (a's 3..6, b's own last one), so an
  // 11-block sequence fits only because 3 were released, and takes them (evicting them); a's and
  // b's tables never name them again.
  SequenceState c{3, iota_tokens(176, 5000), 0};
  CHECK(kv.allocate_slots(c, 176) == std::optional<int64_t>(11));
  CHECK_EQ(kv.pool().n_allocatable(), 0);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, prompt, 0}).n_tokens(), 0);  // evicted: no hit
  for (BlockId blk : kv.block_table(3)) {
    CHECK(std::find(kv.block_table(1).begin(), kv.block_table(1).end(), blk) == kv.block_table(1).end());
  }
  kv.check_invariants();
  // Freeing a table with released entries gives back only what it still holds.
  CHECK(kv.free(1) && kv.free(2) && kv.free(3));
  CHECK_EQ(kv.usage(), 0.0);
  kv.check_invariants();

  // No window (a global layer somewhere): nothing is released.
  KVCacheManager global(kv_config(16, 16));
  SequenceState g{1, prompt, 0};
  CHECK(global.allocate_slots(g, 100).has_value());
  g.n_computed_tokens = 100;
  global.release_outside_window(g);
  for (BlockId blk : global.block_table(1)) CHECK(blk != kNoBlock);
}

TEST(kv_budget_in_tokens_or_bytes) {
  CHECK_EQ(KVCacheConfig::blocks_for_tokens(4096, 16), 256);
  CHECK_EQ(KVCacheConfig::blocks_for_tokens(4100, 16), 256);
  // SmolLM2-135M-like: 30 layers, 3 kv heads of 64, f16 K and V: 2*30*192*2 bytes per token.
  const int64_t per_token = 2 * 30 * 192 * 2;
  CHECK_EQ(KVCacheConfig::blocks_for_bytes(per_token * 16 * 100, per_token, 16), 100);
}

// ---- paged KV memory with the CPU ops -----------------------------------------------------------

// Two sequences whose blocks interleave in the pool: the CPU backend's store_kv/attention over a
// PagedKVCache with the manager's block tables give exactly the results of a contiguous cache,
// for f16 and q8_0 rows.
TEST(paged_kv_cache_matches_a_contiguous_cache) {
  CpuBackend backend(1);
  CHECK_EQ(PagedKVCache::bytes_per_token(30, 192, DType::f16), 2 * 30 * 192 * 2);
  CHECK_EQ(PagedKVCache::bytes_per_token(30, 192, DType::q8_0), 2 * 30 * (192 / 32) * 34);
  for (DType type : {DType::f16, DType::q8_0}) {
    const int64_t n_head = 4, n_head_kv = 2, head_dim = 64, n_kv = n_head_kv * head_dim, bs = 4;
    KVCacheManager kv(kv_config(16, static_cast<int>(bs)));
    PagedKVCache paged(backend, /*n_layer=*/2, n_head_kv, head_dim, kv.n_blocks(), bs, type);
    CHECK_EQ(paged.row_bytes, row_bytes(type, n_kv));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const auto randoms = [&](int64_t n) {
      std::vector<float> v(n);
      for (float& x : v) x = dist(rng);
      return v;
    };
    const int64_t n_pos = 22;
    std::vector<std::vector<float>> ks, vs;
    std::vector<Buffer> contiguous_k, contiguous_v;
    const std::vector<int32_t> tokens_a = iota_tokens(n_pos, 1), tokens_b = iota_tokens(n_pos, 500);
    // Grow both sequences 3 tokens at a time, alternately, so their blocks interleave.
    for (int64_t start = 0; start < n_pos; start += 3) {
      for (SequenceId id : {1, 2}) {
        const auto& tokens = id == 1 ? tokens_a : tokens_b;
        const int64_t n = std::min<int64_t>(3, n_pos - start);
        CHECK(kv.allocate_slots(SequenceState{id, tokens, start}, n).has_value());
      }
    }
    const auto ta = kv.block_table(1), tb = kv.block_table(2);
    CHECK(ta[1] != ta[0] + 1);  // interleaved, not contiguous
    const auto contiguous_view = [&](int s) {
      KVView view;
      view.type = type;
      view.k = contiguous_k[s].as<uint8_t>();
      view.v = contiguous_v[s].as<uint8_t>();
      view.n_head_kv = n_head_kv;
      view.head_bytes = paged.head_bytes;
      view.block_table = nullptr;  // contiguous: one block of every position (KVView in backend.h)
      view.block_size = n_pos;
      return view;
    };
    for (SequenceId id : {1, 2}) {
      const auto table = kv.block_table(id);
      ks.push_back(randoms(n_pos * n_kv));
      vs.push_back(randoms(n_pos * n_kv));
      contiguous_k.push_back(backend.alloc(n_pos * paged.row_bytes));
      contiguous_v.push_back(backend.alloc(n_pos * paged.row_bytes));
      std::vector<int32_t> positions(n_pos);
      std::iota(positions.begin(), positions.end(), 0);
      backend.store_kv(contiguous_view(static_cast<int>(id) - 1), positions.data(), n_pos, n_kv,
                       ks.back().data(), vs.back().data());
      backend.store_kv(paged.layer(1, table.data()), positions.data(), n_pos, n_kv, ks.back().data(),
                       vs.back().data());
    }
    // Attention of the last 5 rows of each sequence, paged vs contiguous, after both were stored.
    AttentionParams params;
    params.n_head = n_head;
    params.n_head_kv = n_head_kv;
    params.head_dim = head_dim;
    params.scale = 0.125f;
    for (int s = 0; s < 2; ++s) {
      const auto table = kv.block_table(s + 1);
      const auto q = randoms(5 * n_head * head_dim);
      const std::vector<int32_t> positions{17, 18, 19, 20, 21};
      std::vector<float> out_paged(q.size()), out_contiguous(q.size());
      backend.attention(q.data(), positions.data(), 5, paged.layer(1, table.data()), params,
                        out_paged.data());
      backend.attention(q.data(), positions.data(), 5, contiguous_view(s), params, out_contiguous.data());
      CHECK(out_paged == out_contiguous);
    }
  }
}

}  // namespace
