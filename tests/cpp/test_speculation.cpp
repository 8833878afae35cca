// tests/cpp/test_speculation.cpp: speculative decoding without a model — prompt lookup and the
// prediction cursor on token lists, the speculator's back-off on a made-up step cost, and the
// engine loop drafting from predictions with the fake runner (outputs must stay the reference's).
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "engine/draft_lookup.h"
#include "engine/engine.h"
#include "engine/speculator.h"
#include "fake_runner.h"
#include "harness.h"

using namespace ember;

namespace {

using Tokens = std::vector<int32_t>;

TEST(ngram_drafts_copy_what_followed_the_latest_match) {
  // ... 7 8 9 | 1 2 3 4 5 | ... 1 2 3 -> 4 5 (the longest suffix "1 2 3" matched).
  const Tokens h = {7, 8, 9, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
  CHECK(ngram_drafts(h, 2, 4, 3) == (Tokens{4, 5, 6}));
  CHECK(ngram_drafts(h, 2, 4, 1) == (Tokens{4}));
  CHECK(ngram_drafts(h, 2, 4, 0).empty());
  // The most recent of two occurrences wins; drafts stop at the end of the history.
  const Tokens twice = {5, 6, 1, 5, 6, 2, 5, 6};
  CHECK(ngram_drafts(twice, 2, 3, 4) == (Tokens{2, 5, 6}));
  // Nothing of at least n_min tokens repeats: no drafts.
  CHECK(ngram_drafts(Tokens{1, 2, 3, 4, 3}, 2, 4, 4).empty());
  CHECK(ngram_drafts(Tokens{1, 2, 3, 4, 3}, 1, 4, 4) == (Tokens{4, 3}));
  CHECK(ngram_drafts(Tokens{1}, 1, 4, 4).empty());
  int64_t n_matched = -1;
  CHECK(ngram_drafts(twice, 2, 3, 4, &n_matched) == (Tokens{2, 5, 6}));
  CHECK_EQ(n_matched, 2);  // "5 6"
  CHECK(ngram_drafts(Tokens{1, 2, 3, 4, 3}, 2, 4, 4, &n_matched).empty());
  CHECK_EQ(n_matched, 0);
}

TEST(prediction_cursor_follows_and_realigns_after_an_edit) {
  // The prediction: a b c d e f g h; the output changes d into X, then goes on as predicted.
  const Tokens p = {10, 11, 12, 13, 14, 15, 16, 17};
  PredictionCursor cursor(p);
  Tokens out;
  CHECK(cursor.drafts(out, 3) == (Tokens{10, 11, 12}));
  out = {10, 11, 12};
  CHECK(cursor.drafts(out, 2) == (Tokens{13, 14}));
  out.push_back(99);                     // departs at 13
  CHECK(cursor.drafts(out, 2).empty());  // "99" is nowhere in the prediction
  CHECK_EQ(cursor.n_matched(), 0);
  out.push_back(14);  // comes back: "14" found after the point of departure
  CHECK(cursor.drafts(out, 10) == (Tokens{15, 16, 17}));
  CHECK_EQ(cursor.n_matched(), 1);  // a realignment on one token: a short run
  out.insert(out.end(), {15, 16, 17});
  CHECK(cursor.drafts(out, 10).empty());  // the prediction is used up
  CHECK_EQ(cursor.n_matched(), 4);
  // A run counts from the start while the output follows the prediction.
  PredictionCursor follow(p);
  CHECK(follow.drafts(Tokens{10, 11, 12, 13, 14}, 2) == (Tokens{15, 16}));
  CHECK_EQ(follow.n_matched(), 5);
}

// A request whose output has left its prediction for text the prediction does not hold drafts
// from its own text instead (prompt lookup): here the prompt starts with the pair of tokens its
// output is about to end with, so the drafts are what followed that pair in the prompt.
TEST(prediction_requests_draft_from_their_own_text_where_the_prediction_is_lost) {
  const Tokens body = iota_tokens(12, 300);
  Tokens prompt;
  for (int32_t first = 100; prompt.empty(); ++first) {  // [L, t0] + body + [L], t0 sampled after it
    for (int32_t guess = 100; guess < 1000 && prompt.empty(); ++guess) {
      Tokens p = {first, guess};
      p.insert(p.end(), body.begin(), body.end());
      p.push_back(first);
      if (next_token(p) == guess) prompt = p;
    }
  }
  SpeculationConfig c;
  c.draft_max = 6;
  c.adaptive = false;
  KVCacheManager kv(kv_config(512, 16));
  Scheduler scheduler(sched_config(512, 64), kv);
  Speculator speculator(c, nullptr);
  RequestOptions o = opts(50);
  o.prediction = {1, 2, 3};  // nothing the output holds
  scheduler.add_request(Request(1, prompt, o));
  FakeRunner runner(512 * 16);
  const StepPlan prefill = scheduler.schedule();
  scheduler.update_from_output(prefill, runner.execute(build_batch(prefill, scheduler)));
  speculator.propose(scheduler);
  CHECK(scheduler.running().front()->draft_token_ids == Tokens(body.begin(), body.begin() + 6));
}

// A rig: scheduler + speculator, no runner; decoding requests made by hand.
struct SpecRig {
  KVCacheManager kv;
  Scheduler scheduler;
  Speculator speculator;
  SpecRig(const SpeculationConfig& c, int64_t budget)
      : kv(kv_config(512, 16)), scheduler(sched_config(budget, 64), kv), speculator(c, nullptr) {}

  // n requests predicting their own output (so drafts are always there), each prefilled (one
  // step with the fake runner).
  void add_decoding(int n) {
    FakeRunner runner(512 * 16);
    for (int i = 0; i < n; ++i) {
      const Tokens prompt = iota_tokens(30, 1000 * (i + 1));
      RequestOptions o = opts(200);
      o.prediction = reference_generate(prompt, o, 4096).tokens;
      scheduler.add_request(Request(i + 1, prompt, o));
    }
    const StepPlan plan = scheduler.schedule();
    scheduler.update_from_output(plan, runner.execute(build_batch(plan, scheduler)));
  }
  // Fits the speculator's step cost to steps of these row counts, each taking fixed_s +
  // per_row_s * rows.
  void observe_steps(std::initializer_list<int64_t> rows, double fixed_s, double per_row_s) {
    StepPlan fake;
    for (int64_t n : rows) {
      fake.n_tokens = n;
      speculator.observe(fake, {}, fixed_s + per_row_s * static_cast<double>(n));
    }
  }
  int64_t n_drafts() const {
    int64_t n = 0;
    for (const Request* r : scheduler.running()) n += static_cast<int64_t>(r->draft_token_ids.size());
    return n;
  }
};

// The back-off: with a step cost that is mostly fixed (memory-bound) a lone request drafts deep;
// when each row costs as much as the fixed part (compute-bound), 16 requests get no drafts.
TEST(speculator_backs_off_when_steps_are_compute_bound) {
  SpeculationConfig c;
  c.draft_max = 8;
  {
    SpecRig rig(c, 512);
    rig.add_decoding(1);
    rig.observe_steps({1, 2, 4, 8, 1, 3, 9}, 0.010, 0.0001);
    CHECK(rig.speculator.cost().per_row_s() < 0.0002);
    rig.speculator.propose(rig.scheduler);
    CHECK_EQ(rig.n_drafts(), 8);  // 0.8^8 * 10 ms > 0.1 ms: every draft pays
  }
  {
    SpecRig rig(c, 512);
    rig.add_decoding(16);
    rig.observe_steps({1, 2, 4, 8, 16, 32, 16}, 0.001, 0.001);
    rig.speculator.propose(rig.scheduler);
    CHECK_EQ(rig.n_drafts(), 0);  // 0.8 * 17 ms < 1 ms * 16 tokens
  }
  c.adaptive = false;  // no back-off: draft_max for everyone
  SpecRig rig(c, 512);
  rig.add_decoding(16);
  rig.speculator.propose(rig.scheduler);
  CHECK_EQ(rig.n_drafts(), 16 * 8);
}

// A draft model that guesses token 1 with the probabilities given (then 0.99), as its judge
// allows, and reports a fixed pass cost.
struct FixedCostDrafter : DraftModel {
  // Counts the guesses judged in *n_judged where given (the speculator owns, and frees, the drafter).
  explicit FixedCostDrafter(double pass_s, std::vector<float> probabilities = {}, int64_t* n_judged = nullptr)
      : probabilities_(std::move(probabilities)), n_judged_(n_judged) {
    for (int64_t n : {1, 2, 4, 1, 3}) cost_.add(n, pass_s);
  }
  void propose(std::span<Query> queries) override {
    for (Query& q : queries) {
      q.drafts.clear();
      q.probabilities.clear();
      for (size_t j = 0; std::ssize(q.drafts) < q.n_draft; ++j) {
        const float p = j < probabilities_.size() ? probabilities_[j] : 0.99f;
        if (n_judged_) ++*n_judged_;
        const Query::Verdict v = q.judge ? q.judge(p) : Query::Verdict{true, true};
        if (v.keep) {
          q.drafts.push_back(1);
          q.probabilities.push_back(p);
        }
        if (!v.keep || !v.more) break;
      }
    }
  }
  void release(std::span<const RequestId>) override {}
  const StepCostModel& cost() const override { return cost_; }
  StepCostModel cost_;
  std::vector<float> probabilities_;
  int64_t* n_judged_;
};

// The drafts a lone prefilled request gets from `drafter` after target steps of 10 ms + 0.1 ms a
// row.
int64_t drafts_for_a_lone_request(const SpeculationConfig& c, std::unique_ptr<DraftModel> drafter) {
  KVCacheManager kv(kv_config(512, 16));
  Scheduler scheduler(sched_config(512, 64), kv);
  Speculator speculator(c, std::move(drafter));
  scheduler.add_request(Request(1, iota_tokens(30, 1000), opts(200)));
  FakeRunner runner(512 * 16);
  const StepPlan prefill = scheduler.schedule();
  scheduler.update_from_output(prefill, runner.execute(build_batch(prefill, scheduler)));
  StepPlan fake;
  for (int64_t n : {1, 2, 4, 8, 1, 3, 9}) {
    fake.n_tokens = n;
    speculator.observe(fake, {}, 0.010 + 0.0001 * static_cast<double>(n));
  }
  speculator.propose(scheduler);
  return std::ssize(scheduler.running().front()->draft_token_ids);
}

// The draft model's own passes count in the back-off: with target steps of 10 ms + 0.1 ms a row,
// a draft model whose pass takes 0.1 ms drafts deep for a lone request, one whose pass takes
// 50 ms (more than the step it would shorten) not at all.
TEST(speculator_counts_the_draft_models_cost) {
  SpeculationConfig c;
  c.source = DraftSource::draft_model;
  c.draft_max = 8;
  for (const double pass_s : {0.0001, 0.050}) {
    const int64_t n_drafts = drafts_for_a_lone_request(c, std::make_unique<FixedCostDrafter>(pass_s));
    // A draft model's prior odds, 3/4 per draft: the j-th draft adds 0.75^(j+1) tokens for
    // 0.1 ms + 0.2 ms of drafting.
    if (pass_s < 0.001) CHECK(n_drafts >= 4);
    else CHECK_EQ(n_drafts, 0);  // 0.75 * 10.1 ms < 50.1 ms
  }
}

// While a draft model drafts, each guess is judged by the draft's probability of it. Target steps
// of 10 ms + 0.1 ms a row and 1 ms draft passes give a depth of 5 (at the prior, 3/4 a draft);
// guesses of 0.99 all get there. A guess of 0.1 after two of 0.99 is still worth its target row
// (v = 0.975^2 * 0.15 = 0.14 against 0.1 ms * 2.3 tokens / 12.3 ms = 0.02), but a next guess,
// worth 0.14 * 3/4, not a pass and a row (1.1 ms * 2.7 / 13.4 ms = 0.22): three drafts, three
// guesses made.
TEST(draft_models_guesses_end_where_their_probability_stops_paying) {
  SpeculationConfig c;
  c.source = DraftSource::draft_model;
  c.draft_max = 8;
  for (const bool unsure_third : {false, true}) {
    int64_t n_judged = 0;
    auto drafter = std::make_unique<FixedCostDrafter>(
        0.001, unsure_third ? std::vector<float>{0.99f, 0.99f, 0.1f} : std::vector<float>{}, &n_judged);
    const int64_t n_drafts = drafts_for_a_lone_request(c, std::move(drafter));
    if (unsure_third) {
      CHECK_EQ(n_drafts, 3);
      CHECK_EQ(n_judged, 3);
    } else {
      CHECK_EQ(n_drafts, 5);
      CHECK_EQ(n_judged, 5);
    }
  }
}

// A draft model priced too dear to pay is still probed, at doubling intervals: its cost is only
// measured when it drafts, so a cold first pass must not stop drafting for good.
TEST(speculator_probes_a_draft_model_it_stopped_using) {
  SpeculationConfig c;
  c.source = DraftSource::draft_model;
  c.draft_max = 8;
  KVCacheManager kv(kv_config(512, 16));
  Scheduler scheduler(sched_config(512, 64), kv);
  Speculator speculator(c, std::make_unique<FixedCostDrafter>(0.050));
  scheduler.add_request(Request(1, iota_tokens(30, 1000), opts(200)));
  FakeRunner runner(512 * 16);
  std::vector<std::pair<int, int64_t>> drafted;  // (step, drafts) of the steps that drafted
  for (int step = 0; step < 60; ++step) {
    if (step > 0) speculator.propose(scheduler);
    const StepPlan plan = scheduler.schedule();
    const std::vector<SampledTokens> sampled = runner.execute(build_batch(plan, scheduler));
    speculator.observe(plan, sampled, 0.010 + 0.0001 * static_cast<double>(plan.n_tokens));
    for (const ScheduledSequence& p : plan.seqs) {
      if (p.n_drafts() > 0) drafted.emplace_back(step, p.n_drafts());
    }
    scheduler.update_from_output(plan, sampled);
  }
  // Step 0 prefills, step 1 (the first decode step, no cost known yet) drafts all it can; then
  // the 8th refusal after it probes 4 deep (step 9), the 16th after that (25), the 32nd (57).
  CHECK(drafted == (std::vector<std::pair<int, int64_t>>{{1, 8}, {9, 4}, {25, 4}, {57, 4}}));
}

// Records what it is asked for.
struct RecordingDrafter : FixedCostDrafter {
  RecordingDrafter() : FixedCostDrafter(0.001) {}
  void propose(std::span<Query> queries) override {
    for (const Query& q : queries) asked.push_back({q.id, static_cast<int64_t>(q.tokens.size()), q.n_draft});
    FixedCostDrafter::propose(queries);
  }
  struct Ask {
    RequestId id;
    int64_t n_tokens, n_draft;
  };
  std::vector<Ask> asked;
};

// The draft model reads a prompt in the step that completes it (after the target's prefill, before
// the first token goes out), once: a prompt prefilled over two steps is read after the second,
// and a decoding request is not read again by catch_up.
TEST(draft_model_reads_a_prompt_when_its_prefill_completes) {
  SpeculationConfig c;
  c.source = DraftSource::draft_model;
  KVCacheManager kv(kv_config(512, 16));
  Scheduler scheduler(sched_config(64, 16), kv);  // 64 tokens a step: a 100-token prompt takes two
  auto drafter = std::make_unique<RecordingDrafter>();
  RecordingDrafter& asked = *drafter;
  Speculator speculator(c, std::move(drafter));
  scheduler.add_request(Request(1, iota_tokens(100, 1000), opts(50)));
  FakeRunner runner(512 * 16);
  StepPlan timed;  // decode steps of 10 ms + 0.1 ms a row, for the back-off
  for (int64_t n : {1, 2, 4, 1}) {
    timed.n_tokens = n;
    speculator.observe(timed, {}, 0.010 + 0.0001 * static_cast<double>(n));
  }
  for (int step = 0; step < 3; ++step) {
    if (step == 2) speculator.propose(scheduler);  // decoding now: drafts, no catch-up
    const StepPlan plan = scheduler.schedule();
    const std::vector<SampledTokens> sampled = runner.execute(build_batch(plan, scheduler));
    speculator.catch_up(plan, scheduler);
    CHECK_EQ(asked.asked.size(), size_t{step == 0 ? 0u : step == 1 ? 1u : 2u});
    scheduler.update_from_output(plan, sampled);
  }
  CHECK(asked.asked[0].id == 1 && asked.asked[0].n_tokens == 100 && asked.asked[0].n_draft == 0);
  CHECK(asked.asked[1].id == 1 && asked.asked[1].n_draft > 0);
}

std::pair<Tokens, TokenEvent> read_stream(EventQueue& events) {
  Tokens tokens;
  while (true) {
    auto e = events.pop(std::chrono::seconds(30));
    if (!e) FAIL("an event stream stalled for 30 s");
    if (e->has_token()) tokens.push_back(e->token);
    if (e->finished()) return {tokens, *e};
  }
}

// Requests with a prediction (their true output with a few tokens changed) among plain ones:
// every output is the reference's, and most predicted tokens were accepted.
TEST(engine_drafts_from_predictions_and_outputs_stay_exact) {
  EngineConfig config;
  config.kv = kv_config(256, 8);
  config.scheduler = sched_config(128, 8);
  config.speculation.adaptive = false;  // the fake runner's step times mean nothing
  auto runner = std::make_unique<FakeRunner>(256 * 8);
  FakeRunner* fake = runner.get();
  Engine engine(config, std::move(runner));
  std::vector<std::pair<Tokens, Engine::Submission>> subs;
  for (int i = 0; i < 8; ++i) {
    const Tokens prompt = iota_tokens(20 + i, 100 * (i + 1));
    RequestOptions o = opts(40);
    if (i % 2 == 0) {
      o.prediction = reference_generate(prompt, o, 4096).tokens;
      o.prediction[10] = 1;
      o.prediction.erase(o.prediction.begin() + 25, o.prediction.begin() + 28);
    }
    subs.emplace_back(prompt, engine.submit(prompt, o));
  }
  int64_t n_accepted = 0;
  for (auto& [prompt, sub] : subs) {
    const auto [tokens, last] = read_stream(*sub.events);
    CHECK(tokens == reference_generate(prompt, opts(40), 4096).tokens);
    CHECK(last.finish_reason == FinishReason::length);
    n_accepted += last.n_accepted_tokens;
  }
  const EngineStats s = engine.stats();
  const int prediction = static_cast<int>(DraftSource::prediction);
  CHECK_EQ(s.speculation.n_accepted[prediction], n_accepted);
  CHECK_EQ(fake->n_accepted, n_accepted);
  CHECK(n_accepted >= 4 * 30);  // of 4 x 39 predictable tokens
  CHECK(s.speculation.n_drafted[prediction] > n_accepted);
  CHECK(fake->n_steps < 8 * 40 / 2);
}

}  // namespace
