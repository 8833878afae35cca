// cpu/parallel.h: splitting an op's rows over the thread pool, or not splitting them when the
// work is too small to pay for waking the workers (most decode-time element-wise ops).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/thread_pool.h"

namespace ember::cpu {

// Calls fn(begin, end) on disjoint parts covering [0, n). Parts go to the pool's threads when
// there are at least 2 * min_per_thread items; otherwise the caller runs fn(0, n) alone.
template <typename Fn>
void parallel_for(ThreadPool& pool, int64_t n, int64_t min_per_thread, const Fn& fn) {
  if (n <= 0) return;
  if (pool.n_threads() == 1 || n < 2 * min_per_thread) {
    fn(int64_t{0}, n);
    return;
  }
  pool.run([&](int ith, int nth) {
    int64_t begin, end;
    split_range(n, ith, nth, &begin, &end);
    if (begin < end) fn(begin, end);
  });
}

// Calls fn(task) for every task in [0, n_tasks), handing tasks out one at a time to whichever
// thread is free: for tasks of unequal cost (causal attention rows) or a busy machine, where
// fixed parts would leave threads idle. Runs on the caller alone when single_threaded.
template <typename Fn>
void parallel_tasks(ThreadPool& pool, int64_t n_tasks, bool single_threaded, const Fn& fn) {
  if (n_tasks <= 0) return;
  if (pool.n_threads() == 1 || n_tasks == 1 || single_threaded) {
    for (int64_t task = 0; task < n_tasks; ++task) fn(task);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t task = next.fetch_add(1, std::memory_order_relaxed); task < n_tasks;
         task = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(task);
    }
  });
}

}  // namespace ember::cpu
