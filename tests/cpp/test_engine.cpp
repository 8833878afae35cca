// tests/cpp/test_engine.cpp: the Engine loop on its own thread with the fake runner —
// submissions from many threads, cancellation, up-front refusals and a full queue, a failing
// runner, and shutdown ending every stream.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "fake_runner.h"
#include "harness.h"

using namespace ember;

namespace {

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
    if (!e) FAIL("an event stream stalled for 30 s");
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
  FAIL("the engine did not go idle");
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
  CHECK_EQ(end.n_cached_tokens, 39);  // every prompt token but the last
}

TEST(engine_rejects_bad_requests_up_front) {
  EngineConfig c = engine_config(4, 16, 512, 4);
  c.max_queue = 2;
  auto runner = std::make_unique<FakeRunner>(64);
  runner->step_delay_us = 2000;
  Engine engine(c, std::move(runner));
  CHECK_THROWS(InvalidArgument, engine.submit(iota_tokens(65, 0), opts(1)), "whole KV cache");
  CHECK_THROWS(InvalidArgument, engine.submit({}, opts(1)), "empty");
  // A full queue: 4 slots and 2 waiting hold 6 requests, whatever runs (here one at a time:
  // 60 + 4 tokens fill the cache), so the 7th is refused. None can finish before: 4 tokens take
  // 4 steps of 2 ms.
  std::vector<Engine::Submission> subs;
  for (int i = 0; i < 6; ++i) subs.push_back(engine.submit(iota_tokens(60, 100 * i), opts(4)));
  CHECK_THROWS(EngineBusy, engine.submit(iota_tokens(60, 600), opts(4)),
               "2 requests wait for a slot, the queue holds 2");
  for (auto& sub : subs) CHECK(read_stream(*sub.events).second.finish_reason == FinishReason::length);
  engine.shutdown();
  CHECK_THROWS(EngineBusy, engine.submit(iota_tokens(4, 0), opts(1)), "shut down");
}

TEST(engine_queue_holds_max_queue_beyond_the_slots_while_a_step_runs) {
  // 16 slots and a queue of 32 take 48 requests, submitted while the loop runs a long step of
  // the first ones' prefills (it used to count the requests that step admitted as waiting,
  // and refused the 33rd). A finished request makes room for one more.
  EngineConfig c = engine_config(1024, 16, 512, 16);
  c.max_queue = 32;
  auto runner = std::make_unique<FakeRunner>(1024 * 16);
  runner->step_delay_us = 20000;
  Engine engine(c, std::move(runner));
  std::vector<Engine::Submission> subs;
  subs.push_back(engine.submit(iota_tokens(20, 0), opts(1000)));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the loop is in its first step
  int n_busy = 0;
  for (int i = 1; i < 64; ++i) {
    try {
      subs.push_back(engine.submit(iota_tokens(20, 100 * i), opts(i == 1 ? 2 : 1000)));
    } catch (const EngineBusy&) {
      ++n_busy;
    }
  }
  CHECK_EQ(subs.size(), size_t{48});
  CHECK_EQ(n_busy, 16);
  CHECK(read_stream(*subs[1].events).second.finish_reason == FinishReason::length);
  subs.push_back(engine.submit(iota_tokens(20, 9000), opts(1)));
  CHECK_THROWS(EngineBusy, engine.submit(iota_tokens(20, 9100), opts(1)), "the queue holds 32");
  engine.shutdown();
  subs.erase(subs.begin() + 1);  // read to its end above
  for (auto& sub : subs) CHECK(read_stream(*sub.events).second.finished());
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
  for (int i = 0; i < 4; ++i)
    subs.push_back(engine->submit(iota_tokens(10, 100 * i), opts(100000), [&] { ++n_notified; }));
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
