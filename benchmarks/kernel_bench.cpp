// benchmarks/kernel_bench.cpp: matmul throughput per weight type on one matrix shape.
// pp-like (n_rows = 512): GFLOP/s, 2 * n_rows * n_in * n_out per call; compute-bound.
// tg-like (n_rows = 1): GB/s of weight bytes streamed per call; memory-bound.
// few-rows (rows=1,2,4,8): ms per call at each row count, and its ratio to 1 row: what verifying
// k speculative drafts costs against one decode step (memory-bound until compute catches up).
// Usage: kernel_bench [n_in n_out] [threads] [rows=N,N,...] [types...]
//        (defaults 2048 5632 2, no rows sweep, all types)
// Best of several repetitions, since a shared machine adds noise in one direction only.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/matmul_kernels.h"
#include "quant/blocks.h"
#include "quant/types.h"

using namespace ember;

namespace {

// EMBER_BENCH_CPU_TIME=1 times with the process CPU clock instead of the wall clock: on a
// machine shared with other work, with 1 thread, it measures the kernel without preemption gaps.
double now_seconds() {
  static const bool cpu_time = std::getenv("EMBER_BENCH_CPU_TIME") != nullptr;
  timespec ts;
  clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double seconds_of(const std::function<void()>& fn, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n_in = 2048, n_out = 5632;
  int n_threads = 2;
  int arg = 1;
  if (argc > 2 && std::isdigit(argv[1][0]) && std::isdigit(argv[2][0])) {
    n_in = std::atoll(argv[1]);
    n_out = std::atoll(argv[2]);
    arg = 3;
  }
  if (argc > arg && std::isdigit(argv[arg][0])) n_threads = std::atoi(argv[arg++]);
  std::vector<int64_t> sweep;
  if (argc > arg && std::strncmp(argv[arg], "rows=", 5) == 0) {
    for (const char* p = argv[arg++] + 5; *p != '\0';) {
      char* end = nullptr;
      sweep.push_back(std::strtoll(p, &end, 10));
      p = *end == ',' ? end + 1 : end;
    }
  }
  std::vector<DType> types;
  for (; arg < argc; ++arg) {
    if (auto t = dtype_from_name(argv[arg])) types.push_back(*t);
  }
  if (types.empty()) {
    types = {DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q8_0, DType::iq4_nl, DType::q2_k,
             DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::f16,  DType::bf16,   DType::f32};
  }
  ThreadPool pool(n_threads);
  cpu::MatmulWorkspace workspace;  // reused by every call, as in the backend
  std::mt19937_64 rng(1);
  std::printf("isa %s, %d threads, W %lld x %lld\n", cpu::isa_name(cpu::active_isa_level()), n_threads,
              static_cast<long long>(n_in), static_cast<long long>(n_out));
  std::printf("%-7s %10s %12s %10s %12s\n", "type", "pp512 ms", "pp GFLOP/s", "tg ms", "tg GB/s");
  const int64_t pp_rows = 512;
  std::vector<float> x(pp_rows * n_in), y(pp_rows * n_out);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  for (DType t : types) {
    if (!cpu::matmul_supports(t)) continue;
    const int64_t w_bytes = row_bytes(t, n_in) * n_out;
    // Random bytes with sane f16 fields would matter for accuracy, not speed: fill with a
    // pattern whose f16 scale fields are finite (0x3c3c = 1.06).
    std::vector<uint8_t> w(w_bytes, 0x3c);
    if (cpu::active_kernels().of(t).pack) {  // the layout the backend repacks the type into at load
      std::vector<uint8_t> packed(cpu::packed_weight_bytes(t, n_in, n_out));
      cpu::pack_matmul_weight(cpu::active_kernels(), t, w.data(), n_in, n_out, packed.data(), pool);
      w = std::move(packed);
    }
    const double pp = seconds_of(
        [&] { cpu::matmul(t, w.data(), n_in, n_out, x.data(), pp_rows, y.data(), pool, workspace); }, 3);
    const double tg = seconds_of(
        [&] { cpu::matmul(t, w.data(), n_in, n_out, x.data(), 1, y.data(), pool, workspace); }, 20);
    std::printf("%-7s %10.2f %12.1f %10.3f %12.2f\n", dtype_name(t), pp * 1e3,
                2.0 * pp_rows * n_in * n_out / pp / 1e9, tg * 1e3, w_bytes / tg / 1e9);
    for (int64_t rows : sweep) {
      const double s = seconds_of(
          [&] { cpu::matmul(t, w.data(), n_in, n_out, x.data(), rows, y.data(), pool, workspace); }, 20);
      std::printf("  %3lld rows %8.3f ms  %5.2fx one row\n", static_cast<long long>(rows), s * 1e3, s / tg);
    }
  }
  return 0;
}
