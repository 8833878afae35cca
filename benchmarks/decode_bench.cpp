// benchmarks/decode_bench.cpp: load time and token-generation speed of one model in C++ alone
// (no Python), for profilers: `perf record -g decode_bench MODEL 1 32` attributes every sample
// to a symbol, which the stripped Python extension cannot.
//
//   g++ -O2 -g -std=c++20 -Icpp benchmarks/decode_bench.cpp build/dev/libember_core.a -lpthread -o
//   /tmp/decode_bench /tmp/decode_bench MODEL.gguf [threads] [n_gen]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/context.h"

using namespace ember;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [threads] [n_gen]\n", argv[0]);
    return 2;
  }
  const int n_threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int n_gen = argc > 3 ? std::atoi(argv[3]) : 32;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto model = Model::load(argv[1], ModelOptions{n_threads});
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
  ContextOptions options;
  options.n_ctx = n_gen + 16;
  options.n_batch = 16;
  Context ctx(model, options);
  std::vector<float> logits(model->config().n_vocab);
  int32_t token = 1;
  ctx.eval_last(&token, 1, logits.data());  // warm-up
  ctx.reset();
  const auto t1 = clock::now();
  for (int i = 0; i < n_gen; ++i) {
    token = 5 + i % 100;
    ctx.eval_last(&token, 1, logits.data());
  }
  const double s = std::chrono::duration<double>(clock::now() - t1).count();
  std::printf("load %.3f s, tg %.2f t/s (%d threads, %d tokens)\n", load_s, n_gen / s, n_threads, n_gen);
  return 0;
}
