// tests/cpp/test_thread_pool.cpp: ThreadPool runs every part of every job exactly once, on any
// thread, whatever the job's number of parts, and a worker the machine does not schedule leaves
// its part to the running threads.
#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "harness.h"

using namespace ember;

TEST(pool_runs_every_part_exactly_once) {
  for (int n_threads : {1, 2, 3, 8}) {
    ThreadPool pool(n_threads);
    std::vector<std::atomic<int>> runs(n_threads);
    for (int job = 0; job < 20000; ++job) {
      for (auto& r : runs) r.store(0);
      int seen_nth = -1;
      pool.run([&](int ith, int nth) {
        runs[ith].fetch_add(1);
        if (ith == 0) seen_nth = nth;
      });
      CHECK_EQ(seen_nth, n_threads);
      for (int i = 0; i < n_threads; ++i) CHECK_EQ(runs[i].load(), 1);
    }
  }
}

// Jobs of more (or fewer) parts than threads, alternating with jobs of one part per thread: every
// part of each runs once and sees the job's part count (a part count from the job before would
// run a part twice, or skip one).
TEST(pool_runs_jobs_of_any_part_count) {
  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    std::vector<std::atomic<int>> runs(64);
    for (int job = 0; job < 20000; ++job) {
      const int n_parts = job % 3 == 2 ? n_threads : 1 + job % 64;
      for (auto& r : runs) r.store(0);
      std::atomic<int> wrong_count{0};
      pool.run(n_parts, [&](int part, int n) {
        runs[part].fetch_add(1);
        if (n != n_parts) wrong_count.fetch_add(1);
      });
      CHECK_EQ(wrong_count.load(), 0);
      for (int i = 0; i < 64; ++i) CHECK_EQ(runs[i].load(), i < n_parts ? 1 : 0);
    }
  }
}

// On one CPU the caller cannot wait for its worker without giving the CPU away; with parts
// claimed, it runs the worker's part itself whenever the worker has not started yet. (A pool
// that hands part 1 to the worker always would never show part 1 on the calling thread.)
TEST(pool_caller_takes_the_part_of_a_worker_that_is_not_running) {
  cpu_set_t one, saved;
  CHECK(sched_getaffinity(0, sizeof(saved), &saved) == 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  }
  CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);  // the worker inherits it
  int caller_ran_part_1 = 0;
  {
    ThreadPool pool(2);
    const std::thread::id caller = std::this_thread::get_id();
    for (int job = 0; job < 2000; ++job) {
      std::atomic<int> done{0};
      pool.run([&](int ith, int) {
        if (ith == 1 && std::this_thread::get_id() == caller) ++caller_ran_part_1;
        done.fetch_add(1);
      });
      CHECK_EQ(done.load(), 2);
    }
  }
  sched_setaffinity(0, sizeof(saved), &saved);
  EXPECT(caller_ran_part_1 > 0, "the caller never ran the worker's part on one CPU");
}
