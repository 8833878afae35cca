// read_bandwidth.cpp: the machine's memory read bandwidth, the ceiling for token generation
// (decode streams every weight once per token). Each thread sums its slice of a buffer much
// larger than the caches; the best of several passes is reported.
//
//   g++ -O3 -march=native -pthread benchmarks/read_bandwidth.cpp -o /tmp/read_bw && /tmp/read_bw [threads]
//   [MiB]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const int n_threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t n_bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024) << 20;
  const size_t n_words = n_bytes / sizeof(uint64_t);
  std::vector<uint64_t> data(n_words);
  for (size_t i = 0; i < n_words; ++i) data[i] = i;  // touch every page
  std::vector<uint64_t> sums(n_threads * 8);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; ++t) {
      threads.emplace_back([&, t] {
        const size_t begin = n_words * t / n_threads, end = n_words * (t + 1) / n_threads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // independent chains keep loads in flight
        for (size_t i = begin; i + 4 <= end; i += 4) {
          s0 += data[i];
          s1 += data[i + 1];
          s2 += data[i + 2];
          s3 += data[i + 3];
        }
        sums[t * 8] = s0 + s1 + s2 + s3;
      });
    }
    for (auto& th : threads) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, n_bytes / s / 1e9);
  }
  uint64_t total = 0;
  for (int t = 0; t < n_threads; ++t) total += sums[t * 8];
  std::printf("read bandwidth: %.2f GB/s (%d threads, %zu MiB, checksum %llu)\n", best, n_threads,
              n_bytes >> 20, static_cast<unsigned long long>(total % 1000));
  return 0;
}
