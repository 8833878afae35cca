// tests/cpp/test_kv_cache_manager.cpp: the KVCacheManager over its block pool — prefix hits
// counted in full blocks, all-or-nothing allocation, eviction order, KV budgets — and the
// PagedKVCache memory it hands out, through the CPU backend's store_kv and attention.
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

TEST(manager_prefix_hit_counts_full_blocks_and_never_the_whole_prompt) {
  KVCacheManager kv(kv_config(64, 16));
  const auto prompt = iota_tokens(160, 1);  // 10 full blocks
  SequenceState a{1, prompt, 0};
  CHECK_EQ(kv.get_computed_blocks(a).n_tokens(), 0);
  CHECK(kv.allocate_slots(a, 160) == std::optional<int64_t>(10));
  a.n_computed_tokens = 160;
  kv.cache_computed_blocks(a);
  CHECK_EQ(kv.pool().n_cached(), 10);

  // The same prompt: 9 blocks hit, the 10th is recomputed so its last row gives logits.
  SequenceState b{2, prompt, 0};
  CHECK_EQ(kv.get_computed_blocks(b).n_tokens(), 144);
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
  // A prompt that is a strict prefix, mid-block: only full blocks count.
  const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 40);
  CHECK_EQ(kv.get_computed_blocks(SequenceState{4, short_prompt, 0}).n_tokens(), 32);
  kv.check_invariants();
  CHECK(kv.free(1) && kv.free(3));
  CHECK(!kv.free(1));
  CHECK_EQ(kv.usage(), 0.0);
  kv.check_invariants();
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
  // 4 blocks; a cached 3-block prefix nobody references, then a request that hits it and needs
  // 2 more blocks: 1 free + 3 evictable looks like 4, but the hit uses 3 of them.
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
  CHECK_EQ(hit.n_tokens(), 12);
  CHECK(!kv.allocate_slots(b, 12, hit).has_value());  // needs 3 more blocks, 1 is left
  CHECK(kv.allocate_slots(b, 4, hit) == std::optional<int64_t>(1));
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
    PagedKVCache paged(backend, /*n_layer=*/2, n_kv, kv.n_blocks(), bs, type);
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
      view.row_bytes = paged.row_bytes;
      view.block_table = nullptr;  // contiguous: position p is slot p (see KVView in backend.h)
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
