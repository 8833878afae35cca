// tests/cpp/test_engine_core.cpp: the model-independent engine core — block pool, KV cache
// manager, scheduler, batch builder and engine loop — driven by a fake runner, no model.
//
// The fake runner stands in for the model with two properties the real one has:
//  * "KV": it writes, at each row's slot, a hash of the row's whole token prefix, and before
//    "attending" checks that every position the sequence reads holds the hash of its own
//    prefix — so a wrong block table, slot mapping, prefix hit or reused block is caught;
//  * "sampling": the next token is a function of the sequence's whole history, so a request's
//    outputs are known in advance (reference_generate) and must not depend on batching,
//    chunking, prefix hits or preemption.
// Prints "N passed, M failed" and exits non-zero when a test failed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cpu/backend_cpu.h"
#include "engine/batch_builder.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_kv_cache.h"

using namespace ember;

// ---- a minimal test harness -------------------------------------------------------------------

namespace {

struct TestFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CHECK(cond)                                                                                     \
  do {                                                                                                  \
    if (!(cond)) throw TestFailure(cat(__FILE__, ":", __LINE__, ": CHECK(" #cond ") failed"));          \
  } while (0)

#define CHECK_EQ(a, b)                                                                                  \
  do {                                                                                                  \
    const auto va_ = (a);                                                                               \
    const auto vb_ = (b);                                                                               \
    if (!(va_ == vb_)) {                                                                                \
      throw TestFailure(cat(__FILE__, ":", __LINE__, ": CHECK_EQ(" #a ", " #b ") failed: ", va_, " != ", vb_)); \
    }                                                                                                   \
  } while (0)

// Runs `body` and expects it to throw E with `needle` in the message.
template <typename E>
void check_throws(const std::function<void()>& body, const std::string& needle, int line) {
  try {
    body();
  } catch (const E& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      throw TestFailure(cat("line ", line, ": message '", e.what(), "' lacks '", needle, "'"));
    }
    return;
  }
  throw TestFailure(cat("line ", line, ": expected an exception containing '", needle, "'"));
}
#define CHECK_THROWS(E, body, needle) check_throws<E>([&] { body; }, needle, __LINE__)

struct TestCase {
  const char* name;
  void (*fn)();
};
std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}
struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};
#define TEST(name)                              \
  void test_##name();                           \
  const Register register_##name{#name, test_##name}; \
  void test_##name()

std::vector<int32_t> iota_tokens(int64_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// ---- the fake model ---------------------------------------------------------------------------

uint64_t mix_token(uint64_t h, int32_t token) {
  uint64_t x = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2));
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// prefix[p] = hash of tokens[0..p] — what a real cache row at position p depends on.
std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens, int64_t n) {
  std::vector<uint64_t> out(n);
  uint64_t h = 1469598103934665603ULL;
  for (int64_t p = 0; p < n; ++p) out[p] = h = mix_token(h, tokens[p]);
  return out;
}

constexpr int32_t kFirstToken = 100, kVocab = 900;

int32_t next_token(std::span<const int32_t> history) {
  const auto h = prefix_hashes(history, static_cast<int64_t>(history.size()));
  return kFirstToken + static_cast<int32_t>(h.back() % kVocab);
}

struct Generation {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::none;
};

// What a request must produce, computed one sequence at a time without any cache.
Generation reference_generate(std::span<const int32_t> prompt, const RequestOptions& options, int64_t max_model_len) {
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  Generation g;
  while (true) {
    const int32_t t = next_token(history);
    history.push_back(t);
    g.tokens.push_back(t);
    if (std::ranges::find(options.stop_token_ids, t) != options.stop_token_ids.end()) {
      g.reason = FinishReason::stop;
    } else if (static_cast<int64_t>(g.tokens.size()) >= options.max_tokens ||
               static_cast<int64_t>(history.size()) >= max_model_len) {
      g.reason = FinishReason::length;
    }
    if (g.reason != FinishReason::none) return g;
  }
}

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int64_t n_slots) : kv_(n_slots, 0) {}

  std::vector<int32_t> execute(const Batch& batch) override {
    batch.validate();
    ++n_steps;
    n_rows_total += batch.n_rows();
    std::vector<int32_t> sampled;
    for (const BatchSequence& s : batch.seqs) {
      const auto prefix = prefix_hashes(s.token_history, s.n_keys());
      for (int64_t i = 0; i < s.n_rows; ++i) {
        kv_.at(batch.slot_mapping[s.row_begin + i]) = prefix[s.start_pos + i];
      }
      // "Attention": every key the last row reads must be this sequence's own prefix.
      const auto table = batch.block_table(s);
      for (int64_t p = 0; p < s.n_keys(); ++p) {
        const int64_t slot = int64_t{table[p / batch.block_size]} * batch.block_size + p % batch.block_size;
        if (kv_.at(slot) != prefix[p]) {
          throw std::logic_error(cat("[fake runner] sequence ", s.id, " reads a wrong K/V at position ", p));
        }
      }
      if (s.output_index >= 0) sampled.push_back(next_token(s.token_history.subspan(0, s.n_keys())));
    }
    if (!batch.output_rows.empty() && fail_next) {
      fail_next = false;
      throw std::runtime_error("fake runner failure");
    }
    if (step_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us));
    return sampled;
  }

  void release(std::span<const SequenceId> ids) override {
    released.insert(released.end(), ids.begin(), ids.end());
  }

  int64_t n_steps = 0, n_rows_total = 0;
  std::atomic<bool> fail_next{false};
  int step_delay_us = 0;
  std::vector<SequenceId> released;

 private:
  std::vector<uint64_t> kv_;  // [n_slots] the prefix hash written at each cache slot
};

// A scheduler over its own KV manager, plus a fake runner over the same slots.
struct Harness {
  KVCacheManager kv;
  Scheduler scheduler;
  FakeRunner runner;
  std::map<RequestId, Generation> results;
  std::map<RequestId, int64_t> cached_tokens;
  int64_t n_steps = 0;

  Harness(const KVCacheConfig& kv_config, const SchedulerConfig& config)
      : kv(kv_config), scheduler(config, kv), runner(kv_config.n_blocks * kv_config.block_size) {}

  void add(RequestId id, std::vector<int32_t> prompt, RequestOptions options = {}) {
    scheduler.add_request(Request(id, prompt, std::move(options)));
  }

  // One full step; checks every invariant afterwards.
  StepPlan step() {
    StepPlan plan = scheduler.schedule();
    scheduler.check_invariants();
    const Batch batch = build_batch(plan, scheduler);
    const auto sampled = runner.execute(batch);
    for (const RequestOutput& out : scheduler.update_from_output(plan, sampled)) {
      results[out.id].tokens.push_back(out.token);
      results[out.id].reason = out.finish_reason;
      cached_tokens[out.id] = out.n_cached_tokens;
    }
    scheduler.check_invariants();
    ++n_steps;
    return plan;
  }

  void run_until_idle(int64_t max_steps = 100000) {
    while (scheduler.has_unfinished()) {
      const StepPlan plan = step();
      CHECK(!plan.empty());  // work left but nothing scheduled would be a hang
      CHECK(n_steps < max_steps);
    }
  }
};

KVCacheConfig kv_config(int64_t n_blocks, int block_size = 16, bool prefix_caching = true) {
  KVCacheConfig c;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.enable_prefix_caching = prefix_caching;
  return c;
}

SchedulerConfig sched_config(int64_t budget = 512, int max_seqs = 16, int64_t max_model_len = 4096) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = max_model_len;
  return c;
}

RequestOptions opts(int64_t max_tokens, int priority = 0) {
  RequestOptions o;
  o.max_tokens = max_tokens;
  o.priority = priority;
  return o;
}

// ---- block hash and block pool ----------------------------------------------------------------

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

// ---- KV cache manager ---------------------------------------------------------------------------

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

// ---- scheduler ----------------------------------------------------------------------------------

TEST(scheduler_splits_the_token_budget) {
  Harness h(kv_config(256), sched_config(512));
  h.add(1, iota_tokens(300, 1000), opts(4));
  h.add(2, iota_tokens(300, 2000), opts(4));
  h.add(3, iota_tokens(100, 3000), opts(4));
  StepPlan p = h.step();
  CHECK_EQ(p.seqs.size(), size_t{2});
  CHECK_EQ(p.seqs[0].n_tokens, 300);
  CHECK(p.seqs[0].needs_sample);
  CHECK_EQ(p.seqs[1].n_tokens, 212);  // the rest of the budget: a chunk
  CHECK(!p.seqs[1].needs_sample);
  CHECK_EQ(p.n_tokens, 512);
  p = h.step();  // running first: 1 decodes, 2 finishes its prompt, then 3 is admitted whole
  CHECK_EQ(p.seqs.size(), size_t{3});
  CHECK_EQ(p.seqs[0].id, 1);
  CHECK_EQ(p.seqs[0].n_tokens, 1);
  CHECK_EQ(p.seqs[0].start_pos, 300);
  CHECK_EQ(p.seqs[1].n_tokens, 88);
  CHECK_EQ(p.seqs[1].start_pos, 212);
  CHECK_EQ(p.seqs[2].n_tokens, 100);
  p = h.step();  // everyone decodes
  CHECK_EQ(p.n_tokens, 3);
  h.run_until_idle();
  for (RequestId id : {1, 2, 3}) {
    const auto want = reference_generate(iota_tokens(id == 3 ? 100 : 300, 1000 * id), opts(4), 4096);
    CHECK(h.results[id].tokens == want.tokens);
    CHECK(h.results[id].reason == FinishReason::length);
  }
}

TEST(scheduler_chunks_long_prompts_across_steps) {
  Harness h(kv_config(256), sched_config(256));
  const auto prompt = iota_tokens(1000, 7);
  h.add(1, prompt, opts(3));
  std::vector<int64_t> chunks, starts;
  while (h.scheduler.has_unfinished()) {
    const StepPlan p = h.step();
    chunks.push_back(p.seqs.at(0).n_tokens);
    starts.push_back(p.seqs.at(0).start_pos);
  }
  CHECK(chunks == (std::vector<int64_t>{256, 256, 256, 232, 1, 1}));
  CHECK(starts == (std::vector<int64_t>{0, 256, 512, 768, 1000, 1001}));
  CHECK(h.results[1].tokens == reference_generate(prompt, opts(3), 4096).tokens);
}

TEST(scheduler_respects_max_num_seqs) {
  Harness h(kv_config(256), sched_config(512, 2));
  for (RequestId id = 1; id <= 5; ++id) h.add(id, iota_tokens(10, 100 * static_cast<int32_t>(id)), opts(5));
  const StepPlan p = h.step();
  CHECK_EQ(p.seqs.size(), size_t{2});
  CHECK_EQ(h.scheduler.n_waiting(), 3);
  int64_t max_running = 0;
  while (h.scheduler.has_unfinished()) {
    h.step();
    max_running = std::max(max_running, h.scheduler.n_running());
  }
  CHECK_EQ(max_running, 2);
  CHECK_EQ(h.results.size(), size_t{5});
}

TEST(scheduler_prefix_hit_for_a_90_percent_shared_prompt) {
  Harness h(kv_config(256), sched_config(512));
  const auto base = iota_tokens(320, 11);  // 20 blocks
  h.add(1, base, opts(2));
  h.run_until_idle();
  auto other = base;
  for (int i = 288; i < 320; ++i) other[i] = 9000 + i;  // shares 288 of 320 tokens (90%)
  h.add(2, other, opts(2));
  const StepPlan p = h.step();
  CHECK_EQ(p.seqs.at(0).start_pos, 288);
  CHECK_EQ(p.seqs.at(0).n_tokens, 32);
  h.run_until_idle();
  CHECK_EQ(h.cached_tokens[2], 288);
  CHECK_EQ(h.cached_tokens[1], 0);
  CHECK(h.results[2].tokens == reference_generate(other, opts(2), 4096).tokens);
  // The identical prompt again: everything but the last block (its last token must run).
  h.add(3, base, opts(2));
  CHECK_EQ(h.step().seqs.at(0).n_tokens, 16);
  h.run_until_idle();
  CHECK_EQ(h.cached_tokens[3], 304);
  CHECK(h.results[3].tokens == h.results[1].tokens);
  CHECK_EQ(h.kv.n_prefix_hit_tokens(), 288 + 304);
}

TEST(scheduler_preempts_the_newest_and_resumes_with_identical_outputs) {
  // Reference: plenty of room. Then the same requests on a pool that can't hold them all.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(iota_tokens(40 + 7 * i, 1000 * (i + 1)));
  const auto run = [&](int64_t n_blocks, int64_t* n_preemptions) {
    Harness h(kv_config(n_blocks, 8), sched_config(128, 8));
    for (int i = 0; i < 6; ++i) h.add(i + 1, prompts[i], opts(40));
    std::vector<RequestId> first_preempted;
    while (h.scheduler.has_unfinished()) {
      const StepPlan p = h.step();
      if (first_preempted.empty() && !p.preempted.empty()) {
        first_preempted = p.preempted;
        // The newest running request goes first, and waits at the front of the queue.
        CHECK_EQ(p.preempted[0], h.scheduler.n_running() + static_cast<int64_t>(p.preempted.size()));
        CHECK(h.scheduler.find(p.preempted[0])->status == RequestStatus::preempted);
        CHECK_EQ(h.scheduler.find(p.preempted[0])->num_computed_tokens, 0);
      }
      CHECK(h.n_steps < 5000);
    }
    *n_preemptions = h.scheduler.n_preemptions();
    return h.results;
  };
  int64_t n_roomy = 0, n_tight = 0;
  const auto roomy = run(512, &n_roomy);
  const auto tight = run(24, &n_tight);  // 192 tokens for 6 requests of up to 115 tokens
  CHECK_EQ(n_roomy, 0);
  CHECK(n_tight > 0);
  for (int i = 0; i < 6; ++i) {
    CHECK(tight.at(i + 1).tokens == roomy.at(i + 1).tokens);
    CHECK(roomy.at(i + 1).tokens == reference_generate(prompts[i], opts(40), 4096).tokens);
  }
}

TEST(scheduler_full_pool_makes_newcomers_wait) {
  // 8 blocks of 8 = 64 tokens; two 30-token prompts fill most of it; a third waits its turn.
  Harness h(kv_config(8, 8), sched_config(512));
  h.add(1, iota_tokens(30, 100), opts(2));
  h.add(2, iota_tokens(30, 200), opts(2));
  h.add(3, iota_tokens(30, 300), opts(2));
  const StepPlan p = h.step();
  CHECK_EQ(p.seqs.size(), size_t{2});
  CHECK_EQ(h.scheduler.n_waiting(), 1);
  CHECK(p.preempted.empty());
  h.run_until_idle();
  CHECK_EQ(h.results.size(), size_t{3});
  CHECK(h.results[3].tokens == reference_generate(iota_tokens(30, 300), opts(2), 4096).tokens);
}

TEST(scheduler_rejects_prompts_that_can_never_run) {
  KVCacheManager kv(kv_config(4, 16));  // 64 tokens
  Scheduler s(sched_config(512, 4, 1024), kv);
  CHECK_EQ(s.max_model_len(), 64);
  CHECK_THROWS(InvalidArgument, s.add_request(Request(1, iota_tokens(65, 0), opts(1))), "whole KV cache");
  CHECK_THROWS(InvalidArgument, s.add_request(Request(1, iota_tokens(0, 0), opts(1))), "empty");
  CHECK_THROWS(InvalidArgument, s.add_request(Request(1, iota_tokens(5, 0), opts(0))), "max_tokens");
  KVCacheManager big(kv_config(1024, 16));
  Scheduler s2(sched_config(512, 4, 100), big);
  CHECK_THROWS(InvalidArgument, s2.add_request(Request(1, iota_tokens(101, 0), opts(1))), "context of 100");
  CHECK(!s.has_unfinished());
  // A prompt of exactly the whole cache runs, and stops at the context with one token.
  s.add_request(Request(2, iota_tokens(64, 0), opts(10)));
  CHECK_THROWS(InvalidArgument, s.add_request(Request(2, iota_tokens(3, 0), opts(1))), "already in use");
  FakeRunner runner(64);
  std::vector<RequestOutput> outs;
  while (s.has_unfinished()) {
    const StepPlan plan = s.schedule();
    CHECK(!plan.empty());
    const auto o = s.update_from_output(plan, runner.execute(build_batch(plan, s)));
    outs.insert(outs.end(), o.begin(), o.end());
  }
  CHECK_EQ(outs.size(), size_t{1});
  CHECK(outs[0].finish_reason == FinishReason::length);
  // Configs that could hang are refused up front.
  SchedulerConfig no_chunks = sched_config(32, 4, 1024);
  no_chunks.enable_chunked_prefill = false;
  CHECK_THROWS(InvalidArgument, Scheduler(no_chunks, kv), "chunked prefill");
  CHECK_THROWS(InvalidArgument, Scheduler(sched_config(0), kv), "max_num_batched_tokens");
}

TEST(scheduler_stops_on_stop_tokens_and_max_len) {
  const auto prompt = iota_tokens(20, 50);
  const auto free_run = reference_generate(prompt, opts(10), 4096);
  RequestOptions with_stop = opts(10);
  with_stop.stop_token_ids = {free_run.tokens[3]};
  const auto want = reference_generate(prompt, with_stop, 4096);
  CHECK(want.reason == FinishReason::stop);
  Harness h(kv_config(64), sched_config(512, 4, 26));
  h.add(1, prompt, with_stop);
  h.add(2, prompt, opts(10));  // the context of 26 ends it after 6 tokens
  h.run_until_idle();
  CHECK(h.results[1].tokens == want.tokens);
  CHECK(h.results[1].reason == FinishReason::stop);
  CHECK_EQ(h.results[2].tokens.size(), size_t{6});
  CHECK(h.results[2].reason == FinishReason::length);
}

TEST(scheduler_cancel_frees_blocks) {
  Harness h(kv_config(64, 8), sched_config(64));
  const double baseline = h.kv.usage();
  CHECK_EQ(baseline, 0.0);
  h.add(1, iota_tokens(100, 1), opts(50));  // chunked: still prefilling after one step
  h.add(2, iota_tokens(20, 500), opts(50));
  h.step();
  CHECK(h.kv.usage() > 0.0);
  CHECK(h.scheduler.cancel(1));   // mid-prefill
  CHECK(!h.scheduler.cancel(1));  // twice: nothing left to free
  CHECK(h.step().finished == (std::vector<RequestId>{1}));  // tells runners who left
  h.step();
  CHECK(h.scheduler.cancel(2));   // decoding
  CHECK_EQ(h.kv.usage(), baseline);
  h.add(3, iota_tokens(20, 900), opts(50));
  CHECK(h.scheduler.cancel(3));   // still waiting
  CHECK(!h.scheduler.has_unfinished());
  const StepPlan p = h.scheduler.schedule();
  CHECK(p.empty());
  CHECK(p.finished == (std::vector<RequestId>{2, 3}));
  h.kv.check_invariants();
  // A finished request: cancel is a no-op, its blocks were freed when it finished.
  h.add(4, iota_tokens(20, 900), opts(2));
  h.run_until_idle();
  CHECK(!h.scheduler.cancel(4));
  CHECK_EQ(h.kv.usage(), baseline);
}

TEST(scheduler_priority_policy) {
  SchedulerConfig c = sched_config(512, 1);
  c.policy = SchedulingPolicy::priority;
  Harness h(kv_config(64), c);
  h.add(1, iota_tokens(10, 1), opts(2, 5));
  h.add(2, iota_tokens(10, 2), opts(2, 1));
  h.add(3, iota_tokens(10, 3), opts(2, 1));
  std::vector<RequestId> order;
  while (h.scheduler.has_unfinished()) {
    const StepPlan p = h.step();
    for (const auto& s : p.seqs) {
      if (s.start_pos == 0) order.push_back(s.id);
    }
  }
  CHECK(order == (std::vector<RequestId>{2, 3, 1}));
  // Under pressure the worst priority is preempted, even if it is older.
  SchedulerConfig c2 = sched_config(512, 4);
  c2.policy = SchedulingPolicy::priority;
  Harness t(kv_config(6, 8), c2);
  t.add(1, iota_tokens(15, 100), opts(30, 9));   // low priority, admitted first
  t.add(2, iota_tokens(15, 200), opts(30, 0));
  RequestId first_victim = -1;
  while (t.scheduler.has_unfinished()) {
    const StepPlan p = t.step();
    if (first_victim < 0 && !p.preempted.empty()) first_victim = p.preempted[0];
  }
  CHECK_EQ(first_victim, 1);
  CHECK(t.results[1].tokens == reference_generate(iota_tokens(15, 100), opts(30), 4096).tokens);
  CHECK(t.results[2].tokens == reference_generate(iota_tokens(15, 200), opts(30), 4096).tokens);
}

TEST(scheduler_without_prefix_caching_recomputes_everything) {
  Harness h(kv_config(64, 16, /*prefix_caching=*/false), sched_config(512));
  h.add(1, iota_tokens(64, 1), opts(2));
  h.run_until_idle();
  h.add(2, iota_tokens(64, 1), opts(2));
  CHECK_EQ(h.step().seqs.at(0).n_tokens, 64);
  h.run_until_idle();
  CHECK(h.results[1].tokens == h.results[2].tokens);
  CHECK_EQ(h.kv.pool().n_cached(), 0);
}

// Random traffic with shared prefixes, cancellations and a tight pool: invariants after every
// step, and every completed request's outputs equal its reference.
TEST(scheduler_random_stress_against_reference) {
  int64_t n_preemptions = 0, n_hit_tokens = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const int block_size = 4 + static_cast<int>(rng() % 3) * 6;  // 4, 10, 16
    SchedulerConfig c = sched_config(16 + rng() % 200, 1 + static_cast<int>(rng() % 6), 300);
    if (seed % 2 == 0) c.policy = SchedulingPolicy::priority;
    Harness h(kv_config(300 / block_size + 2 + rng() % 40, block_size), c);
    std::vector<std::vector<int32_t>> system_prompts;
    for (int i = 0; i < 3; ++i) system_prompts.push_back(iota_tokens(10 + rng() % 60, 10000 * (i + 1)));
    std::map<RequestId, std::pair<std::vector<int32_t>, RequestOptions>> submitted;
    std::set<RequestId> cancelled;
    RequestId next_id = 1;
    for (int step = 0; step < 400 || h.scheduler.has_unfinished(); ++step) {
      if (step < 400 && rng() % 3 == 0) {
        auto prompt = system_prompts[rng() % 3];
        const int n_extra = 1 + static_cast<int>(rng() % 80);
        for (int i = 0; i < n_extra; ++i) prompt.push_back(static_cast<int32_t>(rng() % 5000));
        prompt.resize(std::min<size_t>(prompt.size(), 200));
        RequestOptions o = opts(1 + rng() % 40, static_cast<int>(rng() % 3));
        if (rng() % 4 == 0) o.stop_token_ids = {kFirstToken + static_cast<int32_t>(rng() % kVocab)};
        h.add(next_id, prompt, o);
        submitted[next_id++] = {prompt, o};
      }
      if (rng() % 15 == 0 && next_id > 1) {
        const RequestId victim = 1 + static_cast<RequestId>(rng() % (next_id - 1));
        if (h.scheduler.cancel(victim)) cancelled.insert(victim);
        h.scheduler.check_invariants();
      }
      if (h.scheduler.has_unfinished()) {
        CHECK(!h.step().empty());
      }
      CHECK(step < 20000);
    }
    CHECK_EQ(h.kv.usage(), 0.0);
    n_preemptions += h.scheduler.n_preemptions();
    n_hit_tokens += h.kv.n_prefix_hit_tokens();
    for (const auto& [id, sub] : submitted) {
      const auto want = reference_generate(sub.first, sub.second, 300);
      const auto& got = h.results[id].tokens;
      if (cancelled.contains(id)) {
        CHECK(std::equal(got.begin(), got.end(), want.tokens.begin()));  // a prefix of it
      } else {
        CHECK(got == want.tokens);
        CHECK(h.results[id].reason == want.reason);
      }
    }
  }
  CHECK(n_preemptions > 0);  // the traffic did exercise preemption and prefix hits
  CHECK(n_hit_tokens > 0);
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
      backend.store_kv(contiguous_view(static_cast<int>(id) - 1), positions.data(), n_pos, n_kv, ks.back().data(),
                       vs.back().data());
      backend.store_kv(paged.layer(1, table.data()), positions.data(), n_pos, n_kv, ks.back().data(), vs.back().data());
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
      backend.attention(q.data(), positions.data(), 5, paged.layer(1, table.data()), params, out_paged.data());
      backend.attention(q.data(), positions.data(), 5, contiguous_view(s), params, out_contiguous.data());
      CHECK(out_paged == out_contiguous);
    }
  }
}

// ---- engine loop --------------------------------------------------------------------------------

EngineConfig engine_config(int64_t n_blocks, int block_size, int64_t budget, int max_seqs) {
  EngineConfig c;
  c.kv = kv_config(n_blocks, block_size);
  c.scheduler = sched_config(budget, max_seqs);
  return c;
}

// Reads a stream to its end: the tokens, and the final event.
std::pair<std::vector<int32_t>, TokenEvent> read_stream(EventQueue& events) {
  std::vector<int32_t> tokens;
  while (true) {
    auto e = events.pop(std::chrono::seconds(30));
    if (!e) throw TestFailure("an event stream stalled for 30 s");
    if (e->has_token()) tokens.push_back(e->token);
    if (e->finished()) return {tokens, *e};
  }
}

void wait_idle(const Engine& engine) {
  for (int i = 0; i < 3000; ++i) {
    const EngineStats s = engine.stats();
    if (s.n_running == 0 && s.n_waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  throw TestFailure("the engine did not go idle");
}

TEST(engine_serves_submissions_from_many_threads) {
  auto runner = std::make_unique<FakeRunner>(96 * 8);
  FakeRunner* fake = runner.get();
  // A tight pool (96 blocks of 8) for 4 threads x 6 requests: preemption happens too.
  Engine engine(engine_config(96, 8, 96, 6), std::move(runner));
  const auto system_prompt = iota_tokens(64, 5000);
  std::atomic<int> n_ok{0}, n_bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        auto prompt = system_prompt;
        for (int j = 0; j <= (t * 7 + i * 3) % 40; ++j) prompt.push_back(100 * t + 10 * i + j);
        const RequestOptions o = opts(8 + (t + i) % 20);
        const auto sub = engine.submit(prompt, o);
        const auto [tokens, last] = read_stream(*sub.events);
        const auto want = reference_generate(prompt, o, engine.max_model_len());
        const bool ok = tokens == want.tokens && last.finish_reason == want.reason && last.id == sub.id &&
                        last.n_output_tokens == static_cast<int64_t>(want.tokens.size()) &&
                        last.n_prompt_tokens == static_cast<int64_t>(prompt.size());
        (ok ? n_ok : n_bad)++;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(n_bad.load(), 0);
  CHECK_EQ(n_ok.load(), 24);
  wait_idle(engine);
  const EngineStats s = engine.stats();
  CHECK_EQ(s.kv_usage, 0.0);
  CHECK(s.n_prefix_hit_tokens > 0);  // the shared system prompt was served from the cache
  CHECK(s.n_generation_tokens_total > 24 * 8 - 1);
  engine.shutdown();
  CHECK_EQ(fake->released.size(), size_t{24});  // every request's state was released
}

TEST(engine_cancel_from_another_thread_frees_blocks) {
  auto runner = std::make_unique<FakeRunner>(64 * 16);
  runner->step_delay_us = 200;
  Engine engine(engine_config(64, 16, 512, 4), std::move(runner));
  const auto sub = engine.submit(iota_tokens(40, 1), opts(100000));
  for (int i = 0; i < 3; ++i) CHECK(sub.events->pop().has_token());
  CHECK(engine.stats().kv_usage > 0.0);
  std::thread([&] { engine.cancel(sub.id); }).join();
  const auto [tokens, last] = read_stream(*sub.events);
  CHECK(last.finish_reason == FinishReason::cancelled);
  CHECK(!last.has_token());
  CHECK_EQ(last.n_prompt_tokens, 40);
  wait_idle(engine);
  CHECK_EQ(engine.stats().kv_usage, 0.0);
  engine.cancel(sub.id);  // finished already: ignored
  engine.cancel(12345);   // unknown: ignored
  // The engine still serves.
  const auto again = engine.submit(iota_tokens(40, 1), opts(3));
  const auto [more, end] = read_stream(*again.events);
  CHECK(more == reference_generate(iota_tokens(40, 1), opts(3), 4096).tokens);
  CHECK_EQ(end.n_cached_tokens, 32);
}

TEST(engine_rejects_bad_requests_up_front) {
  EngineConfig c = engine_config(4, 16, 512, 4);
  c.max_queue = 2;
  auto runner = std::make_unique<FakeRunner>(64);
  runner->step_delay_us = 2000;
  Engine engine(c, std::move(runner));
  CHECK_THROWS(InvalidArgument, engine.submit(iota_tokens(65, 0), opts(1)), "whole KV cache");
  CHECK_THROWS(InvalidArgument, engine.submit({}, opts(1)), "empty");
  // A full queue: max_queue requests wait at most (one runs: 60 + 4 tokens fill the cache), so
  // the 3rd or 4th submission is refused, depending on whether the loop picked up the 1st yet.
  std::vector<Engine::Submission> subs;
  bool busy = false;
  try {
    for (int i = 0; i < 6; ++i) subs.push_back(engine.submit(iota_tokens(60, 100 * i), opts(4)));
  } catch (const EngineBusy& e) {
    busy = std::string(e.what()).find("the queue holds 2") != std::string::npos;
  }
  CHECK(busy);
  CHECK(subs.size() == 2 || subs.size() == 3);
  for (auto& sub : subs) CHECK(read_stream(*sub.events).second.finish_reason == FinishReason::length);
  engine.shutdown();
  CHECK_THROWS(EngineBusy, engine.submit(iota_tokens(4, 0), opts(1)), "shut down");
}

TEST(engine_runner_failure_fails_the_step_and_keeps_serving) {
  auto runner = std::make_unique<FakeRunner>(64 * 16);
  FakeRunner* fake = runner.get();
  fake->fail_next = true;
  Engine engine(engine_config(64, 16, 512, 4), std::move(runner));
  const auto sub = engine.submit(iota_tokens(20, 1), opts(5));
  const auto [tokens, last] = read_stream(*sub.events);
  CHECK(tokens.empty());
  CHECK(last.finish_reason == FinishReason::error);
  CHECK(last.error.find("fake runner failure") != std::string::npos);
  wait_idle(engine);
  CHECK_EQ(engine.stats().kv_usage, 0.0);
  const auto ok = engine.submit(iota_tokens(20, 1), opts(5));
  CHECK(read_stream(*ok.events).first == reference_generate(iota_tokens(20, 1), opts(5), 4096).tokens);
}

TEST(engine_shutdown_ends_every_stream) {
  auto runner = std::make_unique<FakeRunner>(64 * 16);
  runner->step_delay_us = 500;
  std::atomic<int> n_notified{0};
  auto engine = std::make_unique<Engine>(engine_config(64, 16, 512, 2), std::move(runner));
  std::vector<Engine::Submission> subs;
  for (int i = 0; i < 4; ++i) subs.push_back(engine->submit(iota_tokens(10, 100 * i), opts(100000), [&] { ++n_notified; }));
  CHECK(subs[0].events->pop().has_token());
  engine.reset();  // destructor: shutdown
  int n_events = 0;
  for (auto& sub : subs) {
    const auto events = sub.events->drain();
    CHECK(!events.empty());
    CHECK(events.back().finish_reason == FinishReason::cancelled);
    n_events += static_cast<int>(events.size());
  }
  CHECK_EQ(n_notified.load(), n_events + 1);  // +1: the token popped above
}

}  // namespace

int main() {
  int n_passed = 0, n_failed = 0;
  for (const TestCase& t : registry()) {
    try {
      t.fn();
      ++n_passed;
      std::printf("ok    %s\n", t.name);
    } catch (const std::exception& e) {
      ++n_failed;
      std::printf("FAIL  %s: %s\n", t.name, e.what());
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", n_passed, n_failed);
  return n_failed == 0 ? 0 : 1;
}
