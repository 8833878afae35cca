// core/thread_pool.cpp: spin-then-sleep workers; see thread_pool.h for why.
#include "core/thread_pool.h"

#include <fstream>
#include <set>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EMBER_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define EMBER_PAUSE() asm volatile("yield")
#else
#define EMBER_PAUSE() ((void)0)
#endif

namespace ember {

namespace {
// Waiting is staged: spin with a pause instruction (a job usually arrives or finishes within
// microseconds), then yield the core (when the machine is oversubscribed, the thread we wait
// for may need our core to make progress), then — for workers — sleep on the condition variable.
constexpr int kPauseRounds = 2000;
constexpr int kYieldRounds = 20000;

// Polls done() with pause, then yield; returns whether done() became true within the budget.
template <typename Done>
bool wait_briefly(Done done, int yield_rounds) {
  for (int i = 0; i < kPauseRounds; ++i) {
    if (done()) return true;
    EMBER_PAUSE();
  }
  for (int i = 0; i < yield_rounds; ++i) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    state_.fetch_add(uint64_t{1} << (2 * kPartBits));
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run(int n_parts, const std::function<void(int, int)>& job) {
  if (n_threads_ == 1) {
    for (int part = 0; part < n_parts; ++part) job(part, n_parts);
    return;
  }
  job_ = &job;
  n_done_.store(0, std::memory_order_relaxed);
  const uint64_t generation = (state_.load(std::memory_order_relaxed) >> (2 * kPartBits)) + 1;
  {
    // The lock pairs with the sleeping side's predicate check so no wake-up is lost.
    std::lock_guard<std::mutex> lock(mutex_);
    state_.store(generation << (2 * kPartBits) | uint64_t(n_parts) << kPartBits, std::memory_order_release);
  }
  wake_.notify_all();
  run_parts(generation);
  auto all_done = [this, n_parts] { return n_done_.load(std::memory_order_acquire) == n_parts; };
  while (!wait_briefly(all_done, kYieldRounds)) {
  }
  job_ = nullptr;
}

void ThreadPool::run_parts(uint64_t generation) {
  uint64_t state = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t part = state & kPartMask, n_parts = (state >> kPartBits) & kPartMask;
    if ((state >> (2 * kPartBits)) != generation || part >= n_parts) return;
    // Claiming a part of this generation pins the job: the caller waits for every part, so
    // job_ stays valid until this part's n_done_ increment.
    if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    (*job_)(static_cast<int>(part), static_cast<int>(n_parts));
    n_done_.fetch_add(1, std::memory_order_acq_rel);
    state = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto new_job = [&] { return (state_.load(std::memory_order_acquire) >> (2 * kPartBits)) != seen; };
    if (!wait_briefly(new_job, kYieldRounds)) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, new_job);
    }
    seen = state_.load(std::memory_order_acquire) >> (2 * kPartBits);
    if (stop_.load()) return;
    run_parts(seen);
  }
}

int ThreadPool::default_n_threads() {
  // Count distinct (physical id, core id) pairs; SMT siblings share a core and add little.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, physical = "0";
  while (std::getline(cpuinfo, line)) {
    auto value = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) physical = value();
    if (line.rfind("core id", 0) == 0) cores.emplace(physical, value());
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace ember
