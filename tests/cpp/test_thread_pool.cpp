// tests/cpp/test_thread_pool.cpp: ThreadPool runs every part of every job exactly once, on any
// thread, and a worker the machine does not schedule leaves its part to the running threads.
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
