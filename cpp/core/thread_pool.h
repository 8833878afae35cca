// core/thread_pool.h: persistent worker threads that run one parallel job at a time.
// Workers spin briefly between jobs (a decode step issues hundreds of small jobs, and waking a
// sleeping thread costs more than most of them), then sleep on a condition variable.
// A job's nth parts are claimed, not assigned: whichever thread is running takes the next part,
// the caller included, and the caller returns once every part is done. A worker the machine has
// not scheduled yet (other processes on the cores) costs that job nothing: the running threads
// do its part, where a fixed assignment would wait for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ember {

class ThreadPool {
 public:
  // n_threads counts the calling thread: ThreadPool(2) starts one worker.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Runs job(ith, nth) for every part ith in [0, nth), nth = n_threads(), each part on one
  // thread (any thread, the caller included; one thread may run several parts, one after the
  // other), and returns when all have finished. Jobs must not throw. Not reentrant.
  void run(const std::function<void(int ith, int nth)>& job) { run(n_threads_, job); }
  // The same with n_parts parts (1 <= n_parts < 65536), claimed the same way: more parts than
  // threads let the threads that run faster (the others share their cores) take more of the work.
  void run(int n_parts, const std::function<void(int part, int n_parts)>& job);

  // Physical cores of this machine (falls back to hardware_concurrency).
  static int default_n_threads();

 private:
  void worker_loop();
  // Runs parts of job `generation` while any is left unclaimed.
  void run_parts(uint64_t generation);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  // The current job: its generation (bumped once per job) above kPartBits bits of its number of
  // parts above kPartBits bits of its next unclaimed part, so that one load tells a thread all three.
  static constexpr int kPartBits = 16;
  static constexpr uint64_t kPartMask = (uint64_t{1} << kPartBits) - 1;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> n_done_{0};  // parts of the current job finished
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// Splits [0, n) into nth nearly equal parts; part ith is [begin, end).
inline void split_range(int64_t n, int ith, int nth, int64_t* begin, int64_t* end) {
  const int64_t per = n / nth, extra = n % nth;
  *begin = ith * per + (ith < extra ? ith : extra);
  *end = *begin + per + (ith < extra ? 1 : 0);
}

}  // namespace ember
