// tests/cpp/test_attention.cpp: the CPU store_kv and attention ops over f16 and q8_0 KV caches,
// at every ISA level this CPU runs (capped by EMBER_CPU_ISA), on fresh random data each run:
//   * store_kv writes, at each position's slot, exactly the bytes of the reference converter
//     (quantize_row_q8_0 / quantize_row_f16, both byte-identical to gguf-py) of the same row;
//     the AVX2 q8_0 quantizer also on hard inputs (ties at many scales, huge and tiny values,
//     scales that overflow f16 or cannot be inverted, inf and NaN);
//   * attention — decode (1 row), prefill (many causal rows, starting at 0 or after cached
//     positions), GQA groups (incl. one above a block's query limit), contiguous and paged
//     block tables, head_dim 32/64/128 and 96 — against a double-precision softmax attention
//     over the SAME cached bytes, dequantized by the reference dequantizers. So no quantization
//     error enters the comparison: what remains is f32 rounding of the kernels (see kRelTol);
//     and each row of a chunk alone gives the same bits as in the chunk (with and without a
//     window).
// Slots no sequence position maps to are filled with 0xff bytes (f16 NaN, q8_0 scale NaN), so a
// kernel reading a wrong slot produces NaN and fails.
// Cases (tests/cpp/harness.h): one per ops level, each printing "isa LEVEL: N passed, M failed;
// worst attention error ..." over its EXPECTs (the avx2 case runs nothing, and prints no isa line,
// where the CPU or EMBER_CPU_ISA leaves only the portable level), then the backend's capability
// query and the cache's checks. The first case prints "seed N; cpu: ...; active isa ...";
// EMBER_TEST_SEED=<n> replays a run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/backend_cpu.h"
#include "cpu/cpu_features.h"
#include "cpu/op_kernels.h"
#include "cpu/ops.h"
#include "harness.h"
#include "kv/paged_kv_cache.h"
#include "quant/blocks.h"
#include "quant/quant.h"

using namespace ember;
using namespace ember::cpu;

namespace {

// The tolerance of |out - reference| relative to the largest |value| in the cache. The output
// is a convex combination of cached values, computed in f32 (unit roundoff u = 6e-8): each score
// is a dot product of head_dim <= 128 terms (scores here reach ~±10, so their f32 error is a few
// 1e-6 at worst, changing the softmax weights by about that relatively), the softmax uses an exp
// within ~2 ulp (AVX2) and the weighted sum runs over <= ~300 keys in f32. Observed errors stay
// below ~2e-6 (the run prints the worst); 2e-5 leaves room for unlucky data while a wrong slot,
// head, block or scale gives errors of order 1e-1.
constexpr double kRelTol = 2e-5;

struct Shape {
  int64_t n_head, n_head_kv, head_dim;
};

// One sequence's cache of n_ctx positions in a pool of blocks (block_size > 0, a shuffled block
// table), or contiguous (block_size 0: no table, the positions' blocks of 16 in order).
struct Cache {
  DType type;
  int64_t n_head_kv, n_kv_dim, head_bytes, block_size, n_slots;
  std::vector<uint8_t> k, v;         // [n_slots / block_size] blocks (KVView's layout)
  std::vector<int32_t> block_table;  // [ceil(n_ctx / block_size)] or empty
  KVView view() const {
    KVView kv;
    kv.type = type;
    kv.k = const_cast<uint8_t*>(k.data());
    kv.v = const_cast<uint8_t*>(v.data());
    kv.n_head_kv = n_head_kv;
    kv.head_bytes = head_bytes;
    kv.block_table = block_table.empty() ? nullptr : block_table.data();
    kv.block_size = block_size;
    return kv;
  }
};

Cache make_cache(DType type, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, int64_t block_size,
                 std::mt19937_64& rng) {
  Cache c;
  c.type = type;
  c.n_head_kv = n_head_kv;
  c.n_kv_dim = n_head_kv * head_dim;
  c.head_bytes = row_bytes(type, head_dim);
  if (block_size > 0) {
    const int64_t n_blocks = (n_ctx + block_size - 1) / block_size;
    std::vector<int32_t> pool(n_blocks + 3);  // three blocks belong to nobody
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    c.block_table.assign(pool.begin(), pool.begin() + n_blocks);
    c.block_size = block_size;
    c.n_slots = static_cast<int64_t>(pool.size()) * block_size;
  } else {
    c.block_size = 16;
    c.n_slots = (n_ctx + 2 + 15) / 16 * 16;
  }
  c.k.assign(c.n_slots * n_head_kv * c.head_bytes, 0xff);
  c.v.assign(c.k.size(), 0xff);
  return c;
}

// Rows of n_kv_dim values whose 32-value blocks have magnitudes spread over e^-2..e^1 (so
// per-block scales matter), with two special rows at the start: all zeros (q8_0 scale 0) and
// exact half-way ties of q8_0's rounding (127/32 sets d = 1/32, the rest are (k + 0.5)/32).
std::vector<float> random_rows(int64_t n_rows, int64_t n_kv_dim, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-2.0f, 1.0f);
  std::vector<float> x(n_rows * n_kv_dim);
  for (int64_t b = 0; b < n_rows * n_kv_dim / kQK; ++b) {
    const float s = std::exp(log_scale(rng));
    for (int j = 0; j < kQK; ++j) x[b * kQK + j] = s * normal(rng);
  }
  if (n_rows > 2) {
    std::fill(x.begin(), x.begin() + n_kv_dim, 0.0f);
    for (int64_t i = 0; i < n_kv_dim; ++i) {
      x[n_kv_dim + i] = (i % kQK == 0 ? 127.0f : float(i % kQK) - 15.5f) / 32.0f;
    }
  }
  return x;
}

// store_kv through `ops`, then the bytes at every position's slot against the reference.
void store_and_check(Cache& c, const std::vector<float>& k, const std::vector<float>& v, int64_t n_ctx,
                     const OpKernels& ops, ThreadPool& pool, const std::string& name) {
  std::vector<int32_t> positions(n_ctx);
  std::iota(positions.begin(), positions.end(), 0);
  std::shuffle(positions.begin(), positions.end(), std::mt19937_64(n_ctx));  // any order of rows
  std::vector<float> ks(k.size()), vs(v.size());  // rows in the order of `positions`
  for (int64_t r = 0; r < n_ctx; ++r) {
    std::copy_n(k.begin() + positions[r] * c.n_kv_dim, c.n_kv_dim, ks.begin() + r * c.n_kv_dim);
    std::copy_n(v.begin() + positions[r] * c.n_kv_dim, c.n_kv_dim, vs.begin() + r * c.n_kv_dim);
  }
  const KVView kv = c.view();
  store_kv(kv, positions.data(), n_ctx, c.n_kv_dim, ks.data(), vs.data(), ops, pool);
  const QuantizeRowFn reference = type_traits(c.type).quantize_row;
  std::vector<uint8_t> want(c.n_head_kv * c.head_bytes);  // a row: head h's bytes from h * head_bytes
  int64_t n_bad = 0;
  for (int64_t t = 0; t < n_ctx; ++t) {
    for (int kv_v = 0; kv_v < 2; ++kv_v) {
      reference((kv_v ? v : k).data() + t * c.n_kv_dim, want.data(), c.n_kv_dim);
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        const uint8_t* got = (kv_v ? kv.v : kv.k) + kv.offset(t, h);
        n_bad += std::memcmp(want.data() + h * c.head_bytes, got, c.head_bytes) != 0;
      }
    }
  }
  EXPECT(n_bad == 0, name + ": store_kv bytes differ from the reference converter in " +
                         std::to_string(n_bad) + " head rows");
}

// out[n_rows, n_head * head_dim] in double: softmax(cap(scale q·k)) · v over the dequantized cache,
// each row over keys max(0, pos - window + 1) .. pos (all keys up to pos when window is 0);
// cap(s) = softcap * tanh(s / softcap) when softcap > 0, else s.
std::vector<double> reference_attention(const Cache& c, const Shape& s, const std::vector<float>& q,
                                        const std::vector<int32_t>& positions, float scale, int64_t window,
                                        float softcap) {
  const DequantizeRowFn dequantize = type_traits(c.type).dequantize_row;
  const int64_t max_pos = *std::max_element(positions.begin(), positions.end());
  std::vector<float> keys((max_pos + 1) * c.n_kv_dim), values(keys.size());  // [position, n_kv_dim]
  const KVView kv = c.view();
  const int64_t hd = s.head_dim;
  for (int64_t t = 0; t <= max_pos; ++t) {
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      dequantize(kv.k + kv.offset(t, h), keys.data() + t * c.n_kv_dim + h * hd, hd);
      dequantize(kv.v + kv.offset(t, h), values.data() + t * c.n_kv_dim + h * hd, hd);
    }
  }
  const int64_t group = s.n_head / s.n_head_kv;
  std::vector<double> out(positions.size() * s.n_head * hd);
  std::vector<double> score(max_pos + 1);
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int64_t h = 0; h < s.n_head; ++h) {
      const float* qh = q.data() + (r * s.n_head + h) * hd;
      const int64_t off = (h / group) * hd, n_keys = positions[r] + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, n_keys - window) : 0;
      double max = -INFINITY, sum = 0.0;
      for (int64_t t = first; t < n_keys; ++t) {
        double dot = 0.0;
        for (int64_t d = 0; d < hd; ++d) dot += double(qh[d]) * keys[t * c.n_kv_dim + off + d];
        score[t] = dot * scale;
        if (softcap > 0) score[t] = softcap * std::tanh(score[t] / softcap);
        max = std::max(max, score[t]);
      }
      for (int64_t t = first; t < n_keys; ++t) sum += score[t] = std::exp(score[t] - max);
      double* o = out.data() + (r * s.n_head + h) * hd;
      for (int64_t t = first; t < n_keys; ++t) {
        for (int64_t d = 0; d < hd; ++d) o[d] += score[t] / sum * values[t * c.n_kv_dim + off + d];
      }
    }
  }
  return out;
}

// n query values of a peaked softmax (scores of a few units).
std::vector<float> random_queries(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> q(n);
  for (float& x : q) x = normal(rng);
  return q;
}

AttentionParams params_of(const Shape& s, int64_t window, float softcap) {
  AttentionParams params;
  params.n_head = s.n_head;
  params.n_head_kv = s.n_head_kv;
  params.head_dim = s.head_dim;
  params.scale = 1.0f / std::sqrt(float(s.head_dim));
  params.window = window;
  params.softcap = softcap;
  return params;
}

// Returns the error relative to max|v|, after EXPECTing it within kRelTol.
double check_attention(Cache& c, const Shape& s, const std::vector<int32_t>& positions, double max_abs_v,
                       const OpKernels& ops, ThreadPool& pool, std::mt19937_64& rng, const std::string& name,
                       int64_t window = 0, float softcap = 0.0f) {
  const int64_t n_rows = static_cast<int64_t>(positions.size()), n_q = s.n_head * s.head_dim;
  const std::vector<float> q = random_queries(n_rows * n_q, rng);
  const AttentionParams params = params_of(s, window, softcap);
  std::vector<float> out(n_rows * n_q, NAN);
  attention(q.data(), positions.data(), n_rows, c.view(), params, out.data(), ops, pool);
  if (ops.level ==
      IsaLevel::avx512) {  // the AVX-512 kernel gives the AVX2 kernel's bits (so no model output moves)
    std::vector<float> out2(out.size(), NAN);
    attention(q.data(), positions.data(), n_rows, c.view(), params, out2.data(), *op_kernels(IsaLevel::avx2),
              pool);
    EXPECT(std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)) == 0,
           name + ": the avx512 kernel's bits differ from the avx2 kernel's");
  }
  const std::vector<double> want = reference_attention(c, s, q, positions, params.scale, window, softcap);
  double worst = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(double(out[i]) - want[i]) / max_abs_v;
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  char detail[64];
  std::snprintf(detail, sizeof(detail), ": error %.3g of max|v| (tolerance %.1g)", worst, kRelTol);
  EXPECT(worst <= kRelTol, name + detail);
  return worst;
}

// A row's output is the same bits whether it is computed alone (decode: its heads maybe split
// across tasks) or among other rows (prefill chunks, speculative verification): speculation is
// exact only if it is.
void check_rows_alone(Cache& c, const Shape& s, const std::vector<int32_t>& positions, const OpKernels& ops,
                      ThreadPool& pool, std::mt19937_64& rng, const std::string& name, int64_t window) {
  const int64_t n_rows = static_cast<int64_t>(positions.size()), n_q = s.n_head * s.head_dim;
  const std::vector<float> q = random_queries(n_rows * n_q, rng);
  const AttentionParams params = params_of(s, window, 0.0f);
  std::vector<float> all(n_rows * n_q), one(n_q);
  attention(q.data(), positions.data(), n_rows, c.view(), params, all.data(), ops, pool);
  int n_differ = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    attention(q.data() + r * n_q, &positions[r], 1, c.view(), params, one.data(), ops, pool);
    n_differ += std::memcmp(one.data(), all.data() + r * n_q, n_q * sizeof(float)) != 0;
  }
  EXPECT(n_differ == 0, name + ": " + std::to_string(n_differ) + " of " + std::to_string(n_rows) +
                            " rows differ alone from the same rows together");
}

// Every store_kv / attention check at one ops level; returns the worst attention error seen.
double run_level(const OpKernels& ops, ThreadPool& pool, std::mt19937_64& rng, const std::string& level) {
  double worst = 0.0;  // largest error / (max |v|) seen, over every attention output
  const auto attend = [&](Cache& c, const Shape& s, const std::vector<int32_t>& positions, double max_abs_v,
                          const std::string& name, int64_t window = 0, float softcap = 0.0f) {
    worst = std::max(worst,
                     check_attention(c, s, positions, max_abs_v, ops, pool, rng, name, window, softcap));
  };
  const std::vector<Shape> shapes = {
      {4, 4, 32},  {6, 2, 64}, {8, 2, 128}, {6, 3, 96},  // MHA, GQA groups of 3 and 4
      {40, 1, 64},                                       // a group past kMaxBlockQueries
      {4, 1, 256},                                       // Gemma 3
  };
  for (DType type : {DType::f16, DType::q8_0}) {
    for (const Shape& s : shapes) {
      for (int64_t block_size : {int64_t{0}, int64_t{16}, int64_t{7}}) {
        const int64_t n_ctx = 200 + std::uniform_int_distribution<int64_t>(0, 100)(rng);
        const int64_t n_kv_dim = s.n_head_kv * s.head_dim;
        const std::string name = level + " " + dtype_name(type) + " n_head=" + std::to_string(s.n_head) +
                                 " n_head_kv=" + std::to_string(s.n_head_kv) +
                                 " head_dim=" + std::to_string(s.head_dim) +
                                 (block_size ? " paged by " + std::to_string(block_size)
                                             : std::string(" contiguous by 16"));
        Cache c = make_cache(type, s.n_head_kv, s.head_dim, n_ctx, block_size, rng);
        const std::vector<float> k = random_rows(n_ctx, n_kv_dim, rng), v = random_rows(n_ctx, n_kv_dim, rng);
        store_and_check(c, k, v, n_ctx, ops, pool, name);
        double max_abs_v = 0.0;
        for (float x : v) max_abs_v = std::max(max_abs_v, double(std::fabs(x)));

        // Decode: one row at the last position, and one early (a single partial tile).
        attend(c, s, {static_cast<int32_t>(n_ctx - 1)}, max_abs_v, name + " decode");
        attend(c, s, {5}, max_abs_v, name + " decode at 5");
        // Prefill from position 0, and a chunk after cached positions.
        std::vector<int32_t> first(37), chunk(29);
        std::iota(first.begin(), first.end(), 0);
        std::iota(chunk.begin(), chunk.end(), static_cast<int32_t>(n_ctx - 29));
        attend(c, s, first, max_abs_v, name + " prefill 0..36");
        attend(c, s, chunk, max_abs_v, name + " prefill chunk");
        check_rows_alone(c, s, chunk, ops, pool, rng, name + " rows alone", 0);
        check_rows_alone(c, s, chunk, ops, pool, rng, name + " rows alone window 45", 45);
        // Sliding windows (gemma3's local layers): shorter than the context, not a multiple of
        // any tile, and one longer than some rows' positions.
        attend(c, s, {static_cast<int32_t>(n_ctx - 1)}, max_abs_v, name + " decode window 77", 77);
        attend(c, s, chunk, max_abs_v, name + " prefill chunk window 45", 45);
        attend(c, s, first, max_abs_v, name + " prefill 0..36 window 20", 20);
        // Gemma 2's soft-capped scores, with a cap below the larger scores (a few units) so
        // that tanh bends them, in both the decode and the prefill kernels.
        attend(c, s, {static_cast<int32_t>(n_ctx - 1)}, max_abs_v, name + " decode softcap 2", 0, 2.0f);
        attend(c, s, chunk, max_abs_v, name + " prefill chunk window 45 softcap 2", 45, 2.0f);
      }
    }
  }
  // f16 alone takes head sizes that are not multiples of 32 (q8_0 refuses them, below).
  for (const Shape& s : {Shape{4, 2, 8}, Shape{2, 1, 40}, Shape{3, 3, 20}}) {
    const int64_t n_ctx = 90;
    Cache c = make_cache(DType::f16, s.n_head_kv, s.head_dim, n_ctx, 16, rng);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> k(n_ctx * c.n_kv_dim), v(k.size());
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    const std::string name = level + " f16 head_dim=" + std::to_string(s.head_dim);
    store_and_check(c, k, v, n_ctx, ops, pool, name);
    double max_abs_v = 0.0;
    for (float x : v) max_abs_v = std::max(max_abs_v, double(std::fabs(x)));
    attend(c, s, {static_cast<int32_t>(n_ctx - 1)}, max_abs_v, name + " decode");
    std::vector<int32_t> rows(n_ctx);
    std::iota(rows.begin(), rows.end(), 0);
    attend(c, s, rows, max_abs_v, name + " prefill");
  }
  return worst;
}

// The avx2 op table's quantize_row_q8_0 against the reference, block by block, on inputs that probe every
// rounding and special case of numpy's arithmetic.
void check_quantizer_avx2(std::mt19937_64& rng) {
  constexpr int64_t n_blocks = 4096;
  std::vector<float> x(n_blocks * kQK);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-140, 127), kind(0, 7), lane(0, kQK - 1), small(-127, 127);
  for (int64_t b = 0; b < n_blocks; ++b) {
    float* block = x.data() + b * kQK;
    const float scale = std::ldexp(1.0f, exponent(rng));  // 2^-140 (f32 subnormal) .. 2^127
    switch (kind(rng)) {
      case 0:  // exact half-way ties of q = v * 127 / amax, at this scale
        for (int j = 0; j < kQK; ++j) block[j] = (float(small(rng)) + 0.5f) * scale;
        block[lane(rng)] = 127.0f * scale;
        break;
      case 1:  // zeros, one value
        std::fill(block, block + kQK, 0.0f);
        block[lane(rng)] = unit(rng) * scale;
        break;
      case 2:  // a NaN or an infinity among finite values
        for (int j = 0; j < kQK; ++j) block[j] = unit(rng) * scale;
        block[lane(rng)] = kind(rng) < 4 ? NAN : (kind(rng) < 4 ? INFINITY : -INFINITY);
        break;
      case 3:  // one huge outlier
        for (int j = 0; j < kQK; ++j) block[j] = unit(rng);
        block[lane(rng)] = 3e38f * unit(rng);
        break;
      default:
        for (int j = 0; j < kQK; ++j) block[j] = unit(rng) * scale;
    }
  }
  std::vector<BlockQ8_0> want(n_blocks), got(n_blocks);
  quantize_row_q8_0(x.data(), want.data(), n_blocks * kQK);
  op_kernels(IsaLevel::avx2)->quantize_row_q8_0(x.data(), got.data(), n_blocks * kQK);
  int64_t n_bad = 0;
  for (int64_t b = 0; b < n_blocks; ++b) n_bad += std::memcmp(&want[b], &got[b], sizeof(BlockQ8_0)) != 0;
  EXPECT(n_bad == 0, "avx2 quantize_row_q8_0: " + std::to_string(n_bad) + " of " + std::to_string(n_blocks) +
                         " blocks differ from the reference");
}

// The run's seed (EMBER_TEST_SEED or random), printed with the CPU's features on first use.
uint64_t run_seed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    if (const char* env = std::getenv("EMBER_TEST_SEED")) s = std::strtoull(env, nullptr, 10);
    const CpuFeatures& f = cpu_features();
    std::printf("seed %llu; cpu: avx2=%d fma=%d f16c=%d avx512=%d; active isa %s\n",
                static_cast<unsigned long long>(s), f.avx2, f.fma, f.f16c,
                isa_supported(IsaLevel::avx512) ? 1 : 0, isa_name(active_isa_level()));
    return s;
  }();
  return seed;
}

// One ops level's case: every check of run_level (and, for avx2, the quantizer's), summed up in
// an "isa LEVEL: N passed, M failed" line.
void check_level(IsaLevel level) {
  std::mt19937_64 rng(run_seed() + static_cast<uint64_t>(level));
  ThreadPool pool(2);  // tasks really split across threads
  const double worst = run_level(*op_kernels(level), pool, rng, isa_name(level));
  if (level == IsaLevel::avx2) check_quantizer_avx2(rng);
  std::printf("isa %s: %d passed, %d failed; worst attention error %.3g of max|v|\n", isa_name(level),
              test::n_expects_passed(), test::n_expects_failed(), worst);
}

// Where the CPU lacks a level, or EMBER_CPU_ISA caps it below, its case runs nothing
// (tests/test_kernels.py knows from the printed features which "isa LEVEL" lines must appear).
void check_level_if_active(IsaLevel level) {
  if (!isa_supported(level) || !isa_within(level, active_isa_level())) {
    std::printf("%s level not run: %s\n", isa_name(level),
                isa_supported(level) ? "capped by EMBER_CPU_ISA" : "not on this CPU");
    return;
  }
  check_level(level);
}

// The ops have three levels: portable C++, AVX2+FMA+F16C, and AVX-512 (the avx512 and amx ISA
// levels; its attention gives the AVX2 bits, faster).
TEST(store_kv_and_attention_scalar) { check_level(IsaLevel::scalar); }
TEST(store_kv_and_attention_avx2) { check_level_if_active(IsaLevel::avx2); }
TEST(store_kv_and_attention_avx512) { check_level_if_active(IsaLevel::avx512); }

TEST(cpu_backend_supports_f16_and_q8_0_kv) {
  CpuBackend backend(1);
  CHECK(backend.supports(Op::attention, DType::q8_0) && backend.supports(Op::store_kv, DType::q8_0) &&
        backend.supports(Op::attention, DType::f16) && !backend.supports(Op::attention, DType::q4_0) &&
        !backend.supports(Op::store_kv, DType::f32));
}

TEST(paged_kv_cache_checks_types_and_sizes) {
  CpuBackend backend(1);
  CHECK_THROWS(Unsupported, PagedKVCache::check_type(DType::q8_0, 8), "head_dim is 8");
  CHECK_THROWS(Unsupported, PagedKVCache::check_type(DType::q4_0, 64), "use f16 or q8_0");
  CHECK_THROWS(InvalidArgument, PagedKVCache(backend, 1, 1, 48, 4, 16, DType::q8_0), "not whole blocks");
  PagedKVCache q8(backend, 2, 3, 64, 4, 16, DType::q8_0);
  CHECK_EQ(q8.head_bytes, 2 * 34);
  CHECK_EQ(q8.row_bytes, 6 * 34);
  CHECK_EQ(q8.layer_bytes(), 64 * 6 * 34);
  CHECK_EQ(q8.k.n_bytes(), size_t{2 * 64 * 6 * 34});
  const KVView layer1 = q8.layer(1, nullptr);
  CHECK(layer1.type == DType::q8_0);
  CHECK(layer1.k == q8.k.as<uint8_t>() + q8.layer_bytes());
  // Block 2, kv head 1, slot 5 of the block: past two blocks of 3 x 16 rows, and head 0's 16.
  const int32_t table[] = {3, 0, 2};
  CHECK_EQ(q8.layer(0, table).offset(2 * 16 + 5, 1), ((2 * 3 + 1) * 16 + 5) * 2 * 34);
}

}  // namespace
