// tests/cpp/test_scheduler.cpp: the Scheduler over a KVCacheManager, stepped by hand with the
// fake runner (no model, no engine thread): token budgets, chunked prefill, prefix hits,
// preemption and resumption, stops, cancellation, priorities, and a random stress run whose
// every output must equal reference_generate's.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/batch_builder.h"
#include "engine/scheduler.h"
#include "fake_runner.h"
#include "harness.h"
#include "kv/kv_cache_manager.h"

using namespace ember;

namespace {

// A scheduler over its own KV manager, plus a fake runner over the same slots.
struct SchedulerRig {
  KVCacheManager kv;
  Scheduler scheduler;
  FakeRunner runner;
  std::map<RequestId, Generation> results;
  std::map<RequestId, int64_t> cached_tokens;
  int64_t n_steps = 0;

  SchedulerRig(const KVCacheConfig& kv_config, const SchedulerConfig& config)
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

TEST(scheduler_splits_the_token_budget) {
  SchedulerRig h(kv_config(256), sched_config(512));
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
  SchedulerRig h(kv_config(256), sched_config(256));
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

// An image's rows run in one pass (Gemma 3's image tokens attend to each other both ways): a
// chunk that would end inside one ends before it, the image comes whole in the next step, and
// an image longer than a step's budget is refused at submission.
TEST(scheduler_never_splits_an_image_across_chunks) {
  SchedulerRig h(kv_config(64), sched_config(32));
  const auto prompt = iota_tokens(100, 7);
  RequestOptions o = opts(2);
  RequestImage image;
  image.pos = 20;
  image.n_tokens = 24;  // positions 20 .. 43: the first chunk of 32 would end inside it
  o.images = {image};
  h.add(1, prompt, o);
  std::vector<int64_t> chunks;
  while (h.scheduler.has_unfinished()) chunks.push_back(h.step().seqs.at(0).n_tokens);
  CHECK(chunks == (std::vector<int64_t>{20, 32, 32, 16, 1}));  // 20 | 20..51 | 52..83 | 84..99
  CHECK(h.results[1].tokens == reference_generate(prompt, opts(2), 4096).tokens);
  RequestOptions too_long = opts(2);
  image.n_tokens = 40;
  too_long.images = {image};
  CHECK_THROWS(InvalidRequest, h.scheduler.validate(prompt, too_long), "max_batch_tokens");
}

TEST(scheduler_respects_parallel) {
  SchedulerRig h(kv_config(256), sched_config(512, 2));
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
  SchedulerRig h(kv_config(256), sched_config(512));
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
  // The identical prompt again: every token but the last (it must run to give logits): 19
  // shared blocks and 15 rows copied from the 20th.
  h.add(3, base, opts(2));
  const StepPlan p3 = h.step();
  CHECK_EQ(p3.seqs.at(0).n_tokens, 1);
  CHECK_EQ(p3.block_copies.size(), size_t{1});
  CHECK_EQ(p3.block_copies.at(0).n_slots, 15);
  h.run_until_idle();
  CHECK_EQ(h.cached_tokens[3], 319);
  CHECK(h.results[3].tokens == h.results[1].tokens);
  CHECK_EQ(h.kv.n_prefix_hit_tokens(), 288 + 319);
}

// A prompt that continues a partly filled block — a finished request's last block, or a
// running one's — gets a copy of its rows (copy on write) and computes only what follows;
// its outputs equal the reference, as with prefix caching off.
TEST(scheduler_partial_block_hits_copy_rows_and_keep_outputs) {
  for (const bool caching : {true, false}) {
    SchedulerRig h(kv_config(64, 16, caching), sched_config(512));
    const auto prompt = iota_tokens(76, 7);  // 4 full blocks and 12 tokens
    h.add(1, prompt, opts(3));
    h.run_until_idle();
    h.add(2, prompt, opts(3));  // the same prompt: 75 tokens reused, the last one recomputed
    const StepPlan p2 = h.step();
    CHECK_EQ(p2.seqs.at(0).start_pos, caching ? 75 : 0);
    h.run_until_idle();
    CHECK_EQ(h.cached_tokens[2], caching ? 75 : 0);
    // Two prompts that share 70 tokens (mid-block) and then differ.
    auto a = iota_tokens(90, 500), b = a;
    for (int i = 70; i < 90; ++i) b[i] = 3000 + i;
    h.add(3, a, opts(4));
    h.run_until_idle();
    h.add(4, b, opts(4));
    h.run_until_idle();
    CHECK_EQ(h.cached_tokens[4], caching ? 70 : 0);
    // A running request's partly filled last block: request 5 decodes (its third block holds 8
    // computed tokens and gets a 9th this step) when a prompt sharing its first 37 tokens comes.
    auto c = iota_tokens(40, 2000), d = c;
    d.resize(37);
    d.push_back(7777);
    h.add(5, c, opts(20));
    h.step();
    h.add(6, d, opts(5));
    const StepPlan p6 = h.step();
    const auto it = std::ranges::find(p6.seqs, RequestId{6}, &ScheduledSequence::id);
    CHECK(it != p6.seqs.end());
    CHECK_EQ(it->start_pos, caching ? 37 : 0);
    CHECK_EQ(p6.block_copies.size(), size_t{caching ? 1u : 0u});
    h.run_until_idle();
    CHECK_EQ(h.cached_tokens[6], caching ? 37 : 0);
    for (const auto& [id, want] : std::map<RequestId, std::pair<std::vector<int32_t>, int64_t>>{
             {1, {prompt, 3}}, {2, {prompt, 3}}, {3, {a, 4}}, {4, {b, 4}}, {5, {c, 20}}, {6, {d, 5}}}) {
      CHECK(h.results[id].tokens == reference_generate(want.first, opts(want.second), 4096).tokens);
    }
    CHECK_EQ(h.runner.n_copied_slots, caching ? 11 + 6 + 5 : 0);
  }
}

// A partial hit whose source block is the room the pool lacks: the request runs without it.
TEST(scheduler_partial_hit_without_room_for_its_source_runs_without_it) {
  SchedulerRig h(kv_config(4, 4), sched_config(64, 4, 16));
  const auto prompt = iota_tokens(14, 40);  // 3 full blocks and 2 tokens: the whole pool
  h.add(1, prompt, opts(1));
  h.run_until_idle();
  CHECK_EQ(h.kv.pool().n_partial(), 1);
  // Blocks 0..2 shared and 2 rows to copy from block 3; but the request needs 4 blocks, the
  // pool has only those 4, and holding block 3 as the copy's source would leave no room.
  auto p = prompt;
  p.resize(16);
  p[14] = 999;
  p[15] = 998;
  h.add(2, p, opts(1));
  const StepPlan plan = h.step();
  CHECK(plan.block_copies.empty());
  CHECK_EQ(plan.seqs.at(0).start_pos, 12);
  h.run_until_idle();
  CHECK(h.results[2].tokens == reference_generate(p, opts(1), 16).tokens);
}

TEST(scheduler_preempts_the_newest_and_resumes_with_identical_outputs) {
  // Reference: plenty of room. Then the same requests on a pool that can't hold them all.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(iota_tokens(40 + 7 * i, 1000 * (i + 1)));
  const auto run = [&](int64_t n_blocks, int64_t* n_preemptions) {
    SchedulerRig h(kv_config(n_blocks, 8), sched_config(128, 8));
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
  SchedulerRig h(kv_config(8, 8), sched_config(512));
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
  CHECK_THROWS(InvalidArgument, Scheduler(sched_config(0), kv), "max_batch_tokens");
}

TEST(scheduler_stops_on_stop_tokens_and_max_len) {
  const auto prompt = iota_tokens(20, 50);
  const auto free_run = reference_generate(prompt, opts(10), 4096);
  RequestOptions with_stop = opts(10);
  with_stop.stop_token_ids = {free_run.tokens[3]};
  const auto want = reference_generate(prompt, with_stop, 4096);
  CHECK(want.reason == FinishReason::stop);
  SchedulerRig h(kv_config(64), sched_config(512, 4, 26));
  h.add(1, prompt, with_stop);
  h.add(2, prompt, opts(10));  // the context of 26 ends it after 6 tokens
  h.run_until_idle();
  CHECK(h.results[1].tokens == want.tokens);
  CHECK(h.results[1].reason == FinishReason::stop);
  CHECK_EQ(h.results[2].tokens.size(), size_t{6});
  CHECK(h.results[2].reason == FinishReason::length);
}

TEST(scheduler_cancel_frees_blocks) {
  SchedulerRig h(kv_config(64, 8), sched_config(64));
  const double baseline = h.kv.usage();
  CHECK_EQ(baseline, 0.0);
  h.add(1, iota_tokens(100, 1), opts(50));  // chunked: still prefilling after one step
  h.add(2, iota_tokens(20, 500), opts(50));
  h.step();
  CHECK(h.kv.usage() > 0.0);
  CHECK(h.scheduler.cancel(1));   // mid-prefill
  CHECK(!h.scheduler.cancel(1));  // twice: nothing left to free
  // The next step tells runners who left.
  CHECK(h.step().finished == (std::vector<RequestId>{1}));
  h.step();
  CHECK(h.scheduler.cancel(2));  // decoding
  CHECK_EQ(h.kv.usage(), baseline);
  h.add(3, iota_tokens(20, 900), opts(50));
  CHECK(h.scheduler.cancel(3));  // still waiting
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
  SchedulerRig h(kv_config(64), c);
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
  SchedulerRig t(kv_config(6, 8), c2);
  t.add(1, iota_tokens(15, 100), opts(30, 9));  // low priority, admitted first
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
  SchedulerRig h(kv_config(64, 16, /*prefix_caching=*/false), sched_config(512));
  h.add(1, iota_tokens(64, 1), opts(2));
  h.run_until_idle();
  h.add(2, iota_tokens(64, 1), opts(2));
  CHECK_EQ(h.step().seqs.at(0).n_tokens, 64);
  h.run_until_idle();
  CHECK(h.results[1].tokens == h.results[2].tokens);
  CHECK_EQ(h.kv.pool().n_cached(), 0);
}

TEST(scheduler_request_without_prefix_reuse_computes_its_whole_prompt) {
  SchedulerRig h(kv_config(64, 16), sched_config(512));
  h.add(1, iota_tokens(64, 1), opts(2));
  h.run_until_idle();
  RequestOptions no_reuse = opts(2);
  no_reuse.reuse_prefix = false;  // llama-server's cache_prompt: false
  h.add(2, iota_tokens(64, 1), no_reuse);
  CHECK_EQ(h.step().seqs.at(0).n_tokens, 64);
  h.run_until_idle();
  CHECK_EQ(h.cached_tokens[2], 0);
  CHECK(h.results[2].tokens == h.results[1].tokens);
  // The cache still serves the next request that allows it.
  // (every token but the last, which is computed again for its logits)
  h.add(3, iota_tokens(64, 1), opts(2));
  CHECK_EQ(h.step().seqs.at(0).n_tokens, 1);
  h.run_until_idle();
  CHECK_EQ(h.cached_tokens[3], 63);
}

// Random traffic with shared prefixes, cancellations and a tight pool: invariants after every
// step, and every completed request's outputs equal its reference.
// The tokens a request will produce next (the fake model's choice after its tokens so far).
std::vector<int32_t> reference_future(std::span<const int32_t> tokens, int64_t n) {
  std::vector<int32_t> history(tokens.begin(), tokens.end()), future;
  for (int64_t i = 0; i < n; ++i) {
    future.push_back(next_token(history));
    history.push_back(future.back());
  }
  return future;
}

struct StressCounts {
  int64_t n_preemptions = 0, n_hit_tokens = 0, n_drafted = 0, n_accepted = 0;
};

// Random traffic (shared system prompts, stops, cancellations, a tight pool) whose every output
// must equal reference_generate's. With drafts, each decoding request gets before each step up
// to 7 drafts: its true continuation, half the time with one token wrong.
StressCounts random_stress(bool with_drafts) {
  StressCounts counts;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const int block_size = 4 + static_cast<int>(rng() % 3) * 6;  // 4, 10, 16
    SchedulerConfig c = sched_config(16 + rng() % 200, 1 + static_cast<int>(rng() % 6), 300);
    if (seed % 2 == 0) c.policy = SchedulingPolicy::priority;
    SchedulerRig h(kv_config(300 / block_size + 2 + rng() % 40, block_size), c);
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
      if (with_drafts) {
        for (const Request* r : h.scheduler.running()) {
          if (r->n_tokens() - r->num_computed_tokens != 1) continue;
          auto drafts = reference_future(r->token_ids, 1 + rng() % 7);
          if (rng() % 2 == 0) drafts[rng() % drafts.size()] = static_cast<int32_t>(rng() % 5000);
          h.scheduler.set_drafts(r->id, std::move(drafts));
        }
      }
      if (h.scheduler.has_unfinished()) {
        CHECK(!h.step().empty());
      }
      // Between steps no request holds a block past its tokens: rejected drafts' went back.
      for (const Request* r : h.scheduler.running()) {
        CHECK(static_cast<int64_t>(h.kv.block_table(r->id).size()) <=
              (r->n_tokens() + block_size - 1) / block_size);
      }
      CHECK(step < 20000);
    }
    CHECK_EQ(h.kv.usage(), 0.0);
    counts.n_preemptions += h.scheduler.n_preemptions();
    counts.n_hit_tokens += h.kv.n_prefix_hit_tokens();
    counts.n_drafted += h.runner.n_drafted;
    counts.n_accepted += h.runner.n_accepted;
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
  return counts;
}

TEST(scheduler_random_stress_against_reference) {
  const StressCounts counts = random_stress(false);
  CHECK(counts.n_preemptions > 0);  // the traffic did exercise preemption and prefix hits
  CHECK(counts.n_hit_tokens > 0);
  CHECK_EQ(counts.n_drafted, 0);
}

// The same traffic with drafts, right and wrong: outputs unchanged, and the fake runner's K/V
// check shows that no prefix hit ever reads a rejected draft's rows.
TEST(scheduler_random_stress_with_drafts_against_reference) {
  const StressCounts counts = random_stress(true);
  CHECK(counts.n_preemptions > 0);
  CHECK(counts.n_hit_tokens > 0);
  CHECK(counts.n_accepted > 0);
  CHECK(counts.n_drafted > counts.n_accepted);  // some were rejected
}

// One request, drafts of 6 with the 4th wrong: each step accepts 3, corrects the 4th, and gives
// back any block that held only rejected rows.
TEST(scheduler_accepts_a_draft_prefix_and_rolls_back_the_rest) {
  SchedulerRig h(kv_config(64, 4), sched_config(64));
  const auto prompt = iota_tokens(10, 1);
  h.add(1, prompt, opts(30));
  h.step();  // the prompt, and the first token
  while (h.scheduler.has_unfinished()) {
    const Request* r = h.scheduler.find(1);
    auto drafts = reference_future(r->token_ids, 6);
    drafts[3] = drafts[3] == 7 ? 8 : 7;
    const int64_t n_before = r->n_tokens();
    h.scheduler.set_drafts(1, drafts);
    const StepPlan p = h.step();
    const int64_t n_drafts = p.seqs.at(0).n_drafts();
    CHECK_EQ(n_drafts, std::min<int64_t>(6, 30 - (n_before - 10) - 1));
    if (const Request* after = h.scheduler.find(1)) {
      CHECK_EQ(after->n_tokens(), n_before + 4);  // 3 drafts and the correction
      CHECK_EQ(after->num_computed_tokens, n_before + 3);
      CHECK_EQ(static_cast<int64_t>(h.kv.block_table(1).size()), (after->n_tokens() + 3) / 4);
    }
  }
  CHECK(h.results[1].tokens == reference_generate(prompt, opts(30), 4096).tokens);
  CHECK(h.results[1].reason == FinishReason::length);
  CHECK(h.runner.n_steps < 12);  // 30 tokens in far fewer than 30 steps
}

}  // namespace
