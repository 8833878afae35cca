// tests/cpp/test_backend_ops.cpp: every op of a backend (the device named by the first argument,
// e.g. "vulkan:0") against the CPU backend, on fresh random inputs and shapes each run, including
// sizes that are not multiples of any tile. Tolerances come from the arithmetic each side is
// allowed (u = 2^-24, the f32 unit roundoff; Vulkan's documented ULP bounds for exp, division,
// sqrt, sin and cos), never from what a run happened to show:
//  - get_rows, add, add_bias, scale, store_kv f16: bit-identical (the same rounded operations);
//  - matmul with float weights: both sides sum n_in products in f32, in different orders, so each
//    is within n_in·u·Σ|w·x| of the exact sum: tolerance 2·n_in·u·Σ|w·x|;
//  - matmul with quantized weights: the CPU also quantizes x to 8 bits per block of 32 (step
//    d = amax/127, error <= d/2 per value), so add Σ_blocks d/2·Σ|w| to the above;
//  - rms_norm: the sum of n squares (n·u each side), sqrt and division (<= 3 + 2.5 ULP): relative
//    2·(n + 8)·u of the result;
//  - silu/gelu·mul, softmax: Vulkan's exp is within 3 + 2|x| ULP, division 2.5 ULP;
//  - rope: Vulkan's sin and cos are within 2^-11 absolute on [-pi, pi] (the shader reduces the
//    angle there first): 2^-11·(|a| + |b|) plus a few ULP;
//  - store_kv q8_0: the scale is amax/127 (division within 2.5 ULP), so a scale may round to the
//    neighbouring f16 and a quant move by one: every value within one quant step;
//  - attention: scores within 2·head_dim·u·scale·Σ|q·k| of each other (each side's dot product),
//    which moves the softmax weights by twice that relatively; plus the exp and the Σ p·v over
//    n_keys terms: max|v|·(4·head_dim·u·scale·max Σ|q·k| + (n_keys + 16 + 2·span)·2u).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "core/error.h"
#include "harness.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/types.h"

using namespace ember;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff
constexpr double kUlp = 2 * kU;

std::mt19937& rng() {
  static std::mt19937 g([] {
    const unsigned seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    return seed;
  }());
  return g;
}
float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng()); }
int64_t pick(std::initializer_list<int64_t> v) {
  return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng()));
}
std::vector<float> randoms(int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = uniform(-scale, scale);
  return v;
}

struct Backends {
  std::unique_ptr<Backend> cpu = make_backend("cpu", 2);
  std::unique_ptr<Backend> dev = make_backend(test::args().empty() ? "cpu" : test::args()[0]);
};
Backends& backends() {
  static Backends b;
  return b;
}

// A buffer of `be` holding `host`.
template <typename T>
Buffer put(Backend& be, const std::vector<T>& host) {
  Buffer b = be.alloc(sizeof(T) * host.size());
  be.upload(b, 0, host.data(), sizeof(T) * host.size());
  return b;
}
template <typename T>
std::vector<T> get(Backend& be, const Buffer& b, size_t n) {
  std::vector<T> host(n);
  be.download(b, 0, host.data(), sizeof(T) * n);
  return host;
}

// Runs f(backend, buffers...) on both backends over copies of the same inputs and returns both
// results of the buffer at `out`.
struct Pair {
  std::vector<float> cpu, dev;
};

// y = op(inputs) on the CPU and on the device; inputs are float vectors, the output has n_out.
template <typename F>
Pair run_both(const std::vector<std::vector<float>>& inputs, size_t n_out, F&& f) {
  Pair p;
  for (int side = 0; side < 2; ++side) {
    Backend& be = side == 0 ? *backends().cpu : *backends().dev;
    std::vector<Buffer> bufs;
    for (const auto& in : inputs) bufs.push_back(put(be, in));
    Buffer y = be.alloc(sizeof(float) * std::max<size_t>(n_out, 1));
    f(be, bufs, y);
    (side == 0 ? p.cpu : p.dev) = get<float>(be, y, n_out);
  }
  return p;
}

void expect_close(const Pair& p, const std::vector<double>& tol, const std::string& what) {
  int n_bad = 0;
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    const double err = std::fabs(static_cast<double>(p.cpu[i]) - p.dev[i]);
    if (!(err <= tol[i]) && n_bad++ < 3) {
      EXPECT(false, cat(what, ": [", i, "] cpu ", p.cpu[i], " device ", p.dev[i], " tolerance ", tol[i]));
    }
  }
  EXPECT(n_bad == 0, cat(what, ": ", n_bad, " of ", p.cpu.size(), " values outside tolerance"));
}

void expect_equal(const Pair& p, const std::string& what) {
  int n_bad = 0;
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    if (std::memcmp(&p.cpu[i], &p.dev[i], 4) != 0 && n_bad++ < 3) {
      EXPECT(false, cat(what, ": [", i, "] cpu ", p.cpu[i], " device ", p.dev[i]));
    }
  }
  EXPECT(n_bad == 0, cat(what, ": ", n_bad, " of ", p.cpu.size(), " values differ"));
}

// Random blocks of a type ember has no quantizer for (the grid i-quants): every byte random (every
// grid row, sign pattern and sub-block scale is a valid encoding), then the block's scale set for
// values of about 1 or less: the f16 d of either sign.
void random_blocks(DType type, uint8_t* bytes, int64_t n_blocks) {
  const int64_t size = type_traits(type).type_size;
  for (int64_t i = 0; i < n_blocks * size; ++i) bytes[i] = static_cast<uint8_t>(rng()() & 0xff);
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* block = bytes + b * size;
    const uint16_t d = f32_to_f16(uniform(-1.0f, 1.0f) / 128.0f);
    if (type == DType::iq1_m) {  // d's nibbles top the four u16 scale words
      uint16_t words[4];
      std::memcpy(words, block + size - 8, 8);
      for (int i = 0; i < 4; ++i)
        words[i] = static_cast<uint16_t>((words[i] & 0x0fff) | ((d >> (4 * i)) & 15) << 12);
      std::memcpy(block + size - 8, words, 8);
    } else {  // the other i-quants lead with d
      std::memcpy(block, &d, 2);
    }
  }
}

// A weight matrix {n_in, n_out} of `type` quantized from random values.
std::vector<uint8_t> random_weights(DType type, int64_t n_in, int64_t n_out, std::vector<float>* values) {
  const TypeTraits& t = type_traits(type);
  std::vector<float> src = randoms(n_in * n_out);
  std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes(type, n_in) * n_out));
  if (t.quantize_row == nullptr) {
    random_blocks(type, bytes.data(), n_in * n_out / t.block_size);
  } else {
    for (int64_t o = 0; o < n_out; ++o) {
      t.quantize_row(src.data() + o * n_in, bytes.data() + o * row_bytes(type, n_in), n_in);
    }
  }
  values->resize(src.size());
  for (int64_t o = 0; o < n_out; ++o) {
    t.dequantize_row(bytes.data() + o * row_bytes(type, n_in), values->data() + o * n_in, n_in);
  }
  return bytes;
}

bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

void check_matmul(DType type) {
  if (!backends().dev->supports(Op::matmul, type))
    FAIL(cat("the device has no ", dtype_name(type), " matmul"));
  const int64_t block = type_traits(type).block_size;
  // Decode-shaped (under the device's mat-mat threshold) and prefill-shaped row counts.
  for (int64_t n_rows : {int64_t{1}, pick({2, 3, 5}), pick({8, 9}), pick({33, 37, 70})}) {
    const int64_t n_in = is_float(type) ? pick({37, 64, 100}) : block * pick({1, 2, 3});
    const int64_t n_out = pick({1, 33, 70});
    std::vector<float> w;
    const std::vector<uint8_t> wbytes = random_weights(type, n_in, n_out, &w);
    const std::vector<float> x = randoms(n_rows * n_in, 2.0f);
    Pair p;
    for (int side = 0; side < 2; ++side) {
      Backend& be = side == 0 ? *backends().cpu : *backends().dev;
      be.reserve_matmul(n_rows, n_in);
      Buffer wb = be.prepare_matmul_weight(type, wbytes.data(), n_in, n_out);
      Buffer xb = put(be, x);
      Buffer yb = be.alloc(sizeof(float) * n_rows * n_out);
      be.matmul(type, wb.data(), n_in, n_out, xb.as<float>(), n_rows, yb.as<float>());
      (side == 0 ? p.cpu : p.dev) = get<float>(be, yb, n_rows * n_out);
    }
    std::vector<double> tol(p.cpu.size());
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t o = 0; o < n_out; ++o) {
        double s = 0, act = 0;
        for (int64_t b0 = 0; b0 < n_in; b0 += 32) {
          double amax = 0, wsum = 0;
          for (int64_t i = b0; i < std::min(n_in, b0 + 32); ++i) {
            amax = std::max(amax, std::fabs(double(x[r * n_in + i])));
            wsum += std::fabs(double(w[o * n_in + i]));
          }
          const double d = is_float(type) ? 0 : amax / 127;
          for (int64_t i = b0; i < std::min(n_in, b0 + 32); ++i)
            s += std::fabs(double(w[o * n_in + i])) * (std::fabs(double(x[r * n_in + i])) + d / 2);
          act += d / 2 * wsum * (1 + 1e-6);
        }
        tol[r * n_out + o] = 2 * n_in * kU * s + act + 1e-30;
      }
    }
    expect_close(p, tol, cat("matmul ", dtype_name(type), " ", n_rows, "x", n_in, " -> ", n_out));
  }
}

void check_get_rows(DType type) {
  const int64_t block = type_traits(type).block_size;
  const int64_t n_cols = is_float(type) ? pick({37, 64, 100}) : block * pick({1, 3});
  const int64_t n_table = 50, n_ids = pick({1, 7, 70});
  std::vector<float> values;
  const std::vector<uint8_t> table = random_weights(type, n_cols, n_table, &values);
  std::vector<int32_t> ids(static_cast<size_t>(n_ids));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng()() % n_table);
  Pair p;
  for (int side = 0; side < 2; ++side) {
    Backend& be = side == 0 ? *backends().cpu : *backends().dev;
    Buffer tb = be.wrap_host(table.data(), table.size());
    Buffer yb = be.alloc(sizeof(float) * n_ids * n_cols);
    be.get_rows(type, tb.data(), n_cols, ids.data(), n_ids, yb.as<float>());
    (side == 0 ? p.cpu : p.dev) = get<float>(be, yb, n_ids * n_cols);
  }
  expect_equal(p, cat("get_rows ", dtype_name(type), " ", n_ids, " of ", n_cols));
}

#define WEIGHT_CASES(type)                           \
  TEST(matmul_##type) { check_matmul(DType::type); } \
  TEST(get_rows_##type) { check_get_rows(DType::type); }
WEIGHT_CASES(f32)
WEIGHT_CASES(f16)
WEIGHT_CASES(bf16)
WEIGHT_CASES(q4_0)
WEIGHT_CASES(q4_1)
WEIGHT_CASES(q5_0)
WEIGHT_CASES(q5_1)
WEIGHT_CASES(q8_0)
WEIGHT_CASES(iq4_nl)
WEIGHT_CASES(q2_k)
WEIGHT_CASES(q3_k)
WEIGHT_CASES(q4_k)
WEIGHT_CASES(q5_k)
WEIGHT_CASES(q6_k)
WEIGHT_CASES(tq1_0)
WEIGHT_CASES(tq2_0)
WEIGHT_CASES(iq4_xs)
WEIGHT_CASES(mxfp4)
WEIGHT_CASES(iq2_xxs)
WEIGHT_CASES(iq2_xs)

// Every row's bits are the same whatever rows come with it (matmul_exact_min_rows() == 1), across
// the device's decode and prefill kernels; else the same from matmul_exact_min_rows() rows on.
TEST(matmul_rows_independent) {
  Backend& be = *backends().dev;
  for (DType type : {DType::f32, DType::q4_0, DType::q6_k, DType::q3_k}) {
    const int64_t n_in = type_traits(type).block_size * (type == DType::f32 ? 3 : 2), n_out = 70;
    const int64_t min_rows = be.matmul_exact_min_rows(type);
    std::vector<float> w;
    const std::vector<uint8_t> wbytes = random_weights(type, n_in, n_out, &w);
    const std::vector<float> x = randoms(70 * n_in, 2.0f);
    be.reserve_matmul(70, n_in);
    Buffer wb = be.prepare_matmul_weight(type, wbytes.data(), n_in, n_out);
    Buffer xb = put(be, x);
    std::vector<std::vector<float>> results;
    const std::vector<int64_t> counts = {std::max<int64_t>(min_rows, 1), std::max<int64_t>(min_rows, 5), 40,
                                         70};
    for (int64_t n_rows : counts) {
      Buffer yb = be.alloc(sizeof(float) * n_rows * n_out);
      be.matmul(type, wb.data(), n_in, n_out, xb.as<float>(), n_rows, yb.as<float>());
      results.push_back(get<float>(be, yb, n_rows * n_out));
    }
    const int64_t n_common = counts[0] * n_out;
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT(std::memcmp(results[0].data(), results[i].data(), sizeof(float) * n_common) == 0,
             cat("matmul ", dtype_name(type), ": the first ", counts[0], " rows differ between calls of ",
                 counts[0], " and ", counts[i], " rows"));
    }
  }
}

TEST(elementwise_exact) {
  const int64_t n_rows = pick({1, 3, 17}), n_cols = pick({1, 37, 300});
  const int64_t n = n_rows * n_cols;
  const std::vector<float> a = randoms(n, 3), b = randoms(n, 3), bias = randoms(n_cols, 3);
  expect_equal(run_both({a, b}, n,
                        [&](Backend& be, auto& in, Buffer& y) {
                          be.add(in[0].template as<float>(), in[1].template as<float>(), n, y.as<float>());
                        }),
               "add");
  expect_equal(run_both({a, bias}, n,
                        [&](Backend& be, auto& in, Buffer& y) {
                          be.add(in[0].template as<float>(), in[0].template as<float>(), 0, y.as<float>());
                          be.add_bias(in[0].template as<float>(), in[1].template as<float>(), n_rows, n_cols);
                          be.download(in[0], 0, nullptr, 0);
                          be.add(in[0].template as<float>(), in[0].template as<float>(), n, y.as<float>());
                        }),
               "add_bias (then x + x)");
  const float s = uniform(-2, 2);
  expect_equal(run_both({a}, n,
                        [&](Backend& be, auto& in, Buffer& y) {
                          be.scale(in[0].template as<float>(), n, s);
                          be.add(in[0].template as<float>(), in[0].template as<float>(), n, y.as<float>());
                        }),
               "scale (then x + x)");
}

TEST(silu_gelu_mul) {
  const int64_t n = pick({1, 37, 1000, 70000});
  const std::vector<float> g = randoms(n, 8), up = randoms(n, 3);
  for (bool gelu : {false, true}) {
    const Pair p = run_both({g, up}, n, [&](Backend& be, auto& in, Buffer& y) {
      if (gelu) {
        be.gelu_mul(in[0].template as<float>(), in[1].template as<float>(), n, y.as<float>());
      } else {
        be.silu_mul(in[0].template as<float>(), in[1].template as<float>(), n, y.as<float>());
      }
    });
    std::vector<double> tol(n);
    for (int64_t i = 0; i < n; ++i) {
      const double a = g[i], u = 0.7978845608028654 * a * (1 + 0.044715 * a * a);
      const double z = gelu ? 2 * std::fabs(u) : std::fabs(a);
      // exp (3 + 2|z| ULP) feeding 1 + e, a division (2.5) and two multiplies, each side; the CPU's
      // 1 + tanh(u) loses up to ulp(1)/2 absolutely to cancellation when u << 0.
      tol[i] = std::fabs(double(p.cpu[i])) * (12 + 2 * z) * kUlp +
               (gelu ? 0.5 * std::fabs(a) * std::fabs(double(up[i])) * 4 * kU : 0) + 1e-37;
    }
    expect_close(p, tol, gelu ? "gelu_mul" : "silu_mul");
  }
}

TEST(gelu) {
  const int64_t n = pick({1, 37, 1000, 70000});
  const std::vector<float> x = randoms(n, 8);
  const Pair p = run_both({x}, n, [&](Backend& be, auto& in, Buffer& y) {
    be.gelu(in[0].template as<float>(), n, y.as<float>());
  });
  std::vector<double> tol(n);
  for (int64_t i = 0; i < n; ++i) {
    // The reference: the exact GELU in double; the CPU (std::erf in f32) within a few ulp of it.
    const double a = x[i], want = 0.5 * a * (1 + std::erf(a / std::sqrt(2.0)));
    EXPECT(std::fabs(p.cpu[i] - want) <= std::fabs(want) * 8 * kUlp + std::fabs(a) * 2 * kU + 1e-37,
           cat("gelu: the CPU gives ", p.cpu[i], " for ", a, ", the exact value is ", want));
    // The shader's erf (Abramowitz-Stegun 7.1.26) is within 1.5e-7 absolutely: 0.5|a| of that,
    // plus the multiplies' rounding on both sides.
    tol[i] = std::fabs(a) * 0.5 * 1.5e-7 + std::fabs(double(p.cpu[i])) * 8 * kUlp + std::fabs(a) * 2 * kU +
             1e-37;
  }
  expect_close(p, tol, cat("gelu ", n));
}

TEST(softcap) {
  const int64_t n = pick({1, 37, 1000, 70000});
  const std::vector<float> x = randoms(n, 80);
  const float cap = 30.0f;  // Gemma 2's final cap: values from ~0 to well past it
  const Pair p = run_both({x}, n, [&](Backend& be, auto& in, Buffer& y) {
    be.softcap(in[0].template as<float>(), n, cap);
    be.add(in[0].template as<float>(), in[0].template as<float>(), n, y.as<float>());
  });
  std::vector<double> tol(n);
  // tanh to a few ulp on each side (the shader's from exp, within 3 + 2|x/cap| ulp) times cap.
  for (int64_t i = 0; i < n; ++i) tol[i] = 2 * cap * (8 + 2 * std::fabs(x[i] / cap)) * kUlp + 1e-37;
  expect_close(p, tol, cat("softcap ", n));
}

TEST(rms_norm) {
  const int64_t n_rows = pick({1, 5, 40}), n_cols = pick({7, 64, 300, 2049});
  const std::vector<float> x = randoms(n_rows * n_cols, 4), w = randoms(n_cols, 2);
  const float eps = 1e-5f;
  const Pair p = run_both({x, w}, n_rows * n_cols, [&](Backend& be, auto& in, Buffer& y) {
    be.rms_norm(in[0].template as<float>(), in[1].template as<float>(), n_rows, n_cols, eps, y.as<float>());
  });
  std::vector<double> tol(p.cpu.size());
  for (size_t i = 0; i < tol.size(); ++i)
    tol[i] = std::fabs(double(p.cpu[i])) * 2 * (n_cols + 8) * kU + 1e-37;
  expect_close(p, tol, cat("rms_norm ", n_rows, "x", n_cols));
}

// layer_norm: the CPU and the device sum the mean and the variance in different orders, each
// within 2·(n + 8)·u relatively of its terms' magnitudes: a value moves by that much of
// |w|·(|x - mean| + |mean|)/std, plus the bias's rounding.
TEST(layer_norm) {
  const int64_t n_rows = pick({1, 5, 40}), n_cols = pick({7, 64, 300, 2049});
  const std::vector<float> x = randoms(n_rows * n_cols, 4), w = randoms(n_cols, 2), b = randoms(n_cols, 1);
  const float eps = 1e-6f;
  const Pair p = run_both({x, w, b}, n_rows * n_cols, [&](Backend& be, auto& in, Buffer& y) {
    be.layer_norm(in[0].template as<float>(), in[1].template as<float>(), in[2].template as<float>(), n_rows,
                  n_cols, eps, y.as<float>());
  });
  std::vector<double> tol(p.cpu.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n_cols; ++i) mean += x[r * n_cols + i];
    mean /= n_cols;
    for (int64_t i = 0; i < n_cols; ++i) var += (x[r * n_cols + i] - mean) * (x[r * n_cols + i] - mean);
    const double inv_std = 1 / std::sqrt(var / n_cols + eps);
    for (int64_t i = 0; i < n_cols; ++i) {
      const double spread = std::fabs(w[i]) * (std::fabs(x[r * n_cols + i] - mean) + std::fabs(mean)) *
                            inv_std;
      tol[r * n_cols + i] = (spread + std::fabs(double(p.cpu[r * n_cols + i]))) * 2 * (n_cols + 8) * kU +
                            1e-37;
    }
  }
  expect_close(p, tol, cat("layer_norm ", n_rows, "x", n_cols));
}

TEST(softmax) {
  const int64_t n_rows = pick({1, 3, 20}), n_cols = pick({1, 37, 1000, 5000});
  const std::vector<float> x = randoms(n_rows * n_cols, 10);
  const Pair p = run_both({x}, n_rows * n_cols, [&](Backend& be, auto& in, Buffer& y) {
    be.softmax(in[0].template as<float>(), n_rows, n_cols);
    be.add(in[0].template as<float>(), in[0].template as<float>(), n_rows * n_cols, y.as<float>());
  });
  std::vector<double> tol(p.cpu.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    const float m = *std::max_element(x.begin() + r * n_cols, x.begin() + (r + 1) * n_cols);
    for (int64_t i = 0; i < n_cols; ++i) {
      const double span = m - x[r * n_cols + i];
      tol[r * n_cols + i] = std::fabs(double(p.cpu[r * n_cols + i])) * (16 + 2 * span + 2 * n_cols) * kUlp +
                            1e-37;
    }
  }
  expect_close(p, tol, cat("softmax ", n_rows, "x", n_cols));
}

TEST(rope) {
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::neox}) {
    const int64_t n_rows = pick({1, 6}), n_heads = pick({1, 3}), head_dim = pick({8, 64, 80});
    const int64_t n_rot = head_dim - pick({0, 4});
    std::vector<float> inv_freq(n_rot / 2);
    for (int64_t i = 0; i < n_rot / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / n_rot);
    std::vector<int32_t> pos(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) pos[r] = static_cast<int32_t>(rng()() % 5000);
    const std::vector<float> x = randoms(n_rows * n_heads * head_dim, 3);
    RopeParams params;
    params.layout = layout;
    params.n_rot = n_rot;
    params.inv_freq = inv_freq.data();
    params.mscale = layout == RopeLayout::neox ? 1.1832f : 1.0f;  // Phi-3's LongRoPE attention factor
    const Pair p = run_both({x}, x.size(), [&](Backend& be, auto& in, Buffer& y) {
      be.rope(in[0].template as<float>(), n_rows, n_heads, head_dim, pos.data(), params);
      be.add(in[0].template as<float>(), in[0].template as<float>(), x.size(), y.as<float>());
    });
    // Each output mixes a pair (a, b): 2^-11 (|a| + |b|) from sin/cos (times mscale), doubled by the x + x.
    std::vector<double> tol(x.size());
    const int64_t stride = layout == RopeLayout::neox ? 1 : 2,
                  partner = layout == RopeLayout::neox ? n_rot / 2 : 1;
    for (int64_t h = 0; h < n_rows * n_heads; ++h) {
      for (int64_t d = 0; d < head_dim; ++d) tol[h * head_dim + d] = 0;
      for (int64_t i = 0; i < n_rot / 2; ++i) {
        const int64_t a = h * head_dim + i * stride, b = a + partner;
        const double t = 2 * params.mscale * (std::fabs(double(x[a])) + std::fabs(double(x[b]))) *
                         (1.0 / 2048 + 8 * kUlp);
        tol[a] = tol[b] = t;
      }
    }
    expect_close(p, tol,
                 cat("rope ", layout == RopeLayout::neox ? "neox" : "interleaved", " head_dim ", head_dim));
  }
}

// A paged cache of n_blocks blocks with a shuffled block table for one sequence of n_pos tokens.
struct PagedSetup {
  int64_t block_size = 0, n_blocks = 0, n_kv_dim = 0, n_head_kv = 0, head_bytes = 0, row_bytes = 0;
  std::vector<int32_t> table;
  // Bytes from the cache's start to kv head h's values in slot `slot` (KVView's layout).
  int64_t offset(int64_t slot, int64_t h) const {
    return ((slot / block_size * n_head_kv + h) * block_size + slot % block_size) * head_bytes;
  }
};
PagedSetup paged_setup(DType type, int64_t n_head_kv, int64_t n_kv_dim, int64_t n_pos) {
  PagedSetup s;
  s.block_size = pick({4, 16});
  s.n_blocks = n_pos / s.block_size + 3;
  s.n_kv_dim = n_kv_dim;
  s.n_head_kv = n_head_kv;
  s.head_bytes = row_bytes(type, n_kv_dim / n_head_kv);
  s.row_bytes = n_head_kv * s.head_bytes;
  for (int64_t i = 0; i < s.n_blocks; ++i) s.table.push_back(static_cast<int32_t>(i));
  std::shuffle(s.table.begin(), s.table.end(), rng());
  return s;
}
KVView view_of(DType type, const PagedSetup& s, const Buffer& k, const Buffer& v) {
  KVView view;
  view.type = type;
  view.k = k.as<uint8_t>();
  view.v = v.as<uint8_t>();
  view.n_head_kv = s.n_head_kv;
  view.head_bytes = s.head_bytes;
  view.block_table = s.table.data();
  view.block_size = s.block_size;
  return view;
}

void check_store_kv(DType type) {
  const int64_t n_head_kv = pick({1, 2});
  const int64_t n_kv_dim = n_head_kv * (type == DType::q8_0 ? 32 * pick({1, 3}) : pick({4, 20, 48}));
  const int64_t first = pick({0, 5, 30}), n_rows = pick({1, 7, 20});
  const PagedSetup s = paged_setup(type, n_head_kv, n_kv_dim, first + n_rows);
  const std::vector<float> k = randoms(n_rows * n_kv_dim, 3), v = randoms(n_rows * n_kv_dim, 3);
  std::vector<int32_t> pos(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) pos[r] = static_cast<int32_t>(first + r);
  const size_t cache_bytes = static_cast<size_t>(s.n_blocks * s.block_size * s.row_bytes);
  std::vector<uint8_t> out[2][2];
  for (int side = 0; side < 2; ++side) {
    Backend& be = side == 0 ? *backends().cpu : *backends().dev;
    const std::vector<uint8_t> zeros(cache_bytes, 0);
    Buffer kc = put(be, zeros), vc = put(be, zeros), kb = put(be, k), vb = put(be, v);
    be.store_kv(view_of(type, s, kc, vc), pos.data(), n_rows, n_kv_dim, kb.as<float>(), vb.as<float>());
    out[side][0] = get<uint8_t>(be, kc, cache_bytes);
    out[side][1] = get<uint8_t>(be, vc, cache_bytes);
  }
  for (int kv = 0; kv < 2; ++kv) {
    if (type == DType::f16) {
      EXPECT(out[0][kv] == out[1][kv], cat("store_kv f16 ", kv ? "v" : "k", ": cache bytes differ"));
      continue;
    }
    // q8_0: compare values, within one quant step of the CPU's block.
    const int64_t n_slots = s.n_blocks * s.block_size;
    std::vector<float> a(n_slots * n_kv_dim), b(n_slots * n_kv_dim);
    dequantize_row_q8_0(out[0][kv].data(), a.data(), n_slots * n_kv_dim);
    dequantize_row_q8_0(out[1][kv].data(), b.data(), n_slots * n_kv_dim);
    int n_bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const auto* blk = reinterpret_cast<const uint16_t*>(out[0][kv].data() + (i / 32) * 34);
      const double step = f16_to_f32(*blk) * (1 + 1.0 / 1024);
      if (std::fabs(double(a[i]) - b[i]) > step + 1e-30) ++n_bad;
    }
    EXPECT(n_bad == 0, cat("store_kv q8_0 ", kv ? "v" : "k", ": ", n_bad, " values off by more than a step"));
  }
}

TEST(store_kv_f16) { check_store_kv(DType::f16); }
TEST(store_kv_q8_0) { check_store_kv(DType::q8_0); }

// copy_kv: the leading n slots of one block into another, every kv head, K and V; byte for
// byte, the rest of the cache untouched (a copy is exact on every backend).
TEST(copy_kv) {
  const DType type = pick({0, 1}) ? DType::f16 : DType::q8_0;
  const int64_t n_head_kv = pick({1, 2, 3});
  const PagedSetup s = paged_setup(type, n_head_kv, n_head_kv * 32 * pick({1, 2}), 40);
  const int32_t src = static_cast<int32_t>(pick({0, 1, 2})), dst = static_cast<int32_t>(s.n_blocks - 1);
  const int64_t n_slots = pick({1, 3}) % s.block_size;
  const size_t cache_bytes = static_cast<size_t>(s.n_blocks * s.block_size * s.row_bytes);
  std::vector<uint8_t> k0(cache_bytes), v0(cache_bytes);
  for (auto& x : k0) x = static_cast<uint8_t>(rng()());
  for (auto& x : v0) x = static_cast<uint8_t>(rng()());
  // What the copy must leave: dst's first n_slots rows of each head are src's.
  std::vector<uint8_t> want[2] = {k0, v0};
  for (std::vector<uint8_t>& w : want) {
    for (int64_t h = 0; h < n_head_kv; ++h) {
      const int64_t from = s.offset(int64_t{src} * s.block_size, h),
                    to = s.offset(int64_t{dst} * s.block_size, h);
      std::copy(w.begin() + from, w.begin() + from + n_slots * s.head_bytes, w.begin() + to);
    }
  }
  for (int side = 0; side < 2; ++side) {
    Backend& be = side == 0 ? *backends().cpu : *backends().dev;
    Buffer kc = put(be, k0), vc = put(be, v0);
    KVView view = view_of(type, s, kc, vc);
    view.block_table = nullptr;
    be.copy_kv(view, src, dst, n_slots);
    EXPECT(get<uint8_t>(be, kc, cache_bytes) == want[0], cat(be.name(), " copy_kv: k bytes differ"));
    EXPECT(get<uint8_t>(be, vc, cache_bytes) == want[1], cat(be.name(), " copy_kv: v bytes differ"));
  }
}

void check_attention(DType type) {
  const int64_t head_dim = type == DType::q8_0 ? pick({32, 64}) : pick({40, 64, 128});
  const int64_t n_head_kv = pick({1, 2}), n_head = n_head_kv * pick({1, 3});
  const int64_t n_kv_dim = n_head_kv * head_dim;
  const int64_t first = pick({0, 9, 70, 150}), n_rows = pick({1, 5, 17});
  const int64_t n_pos = first + n_rows;
  const PagedSetup s = paged_setup(type, n_head_kv, n_kv_dim, n_pos);
  std::vector<int32_t> pos(n_pos);
  for (int64_t t = 0; t < n_pos; ++t) pos[t] = static_cast<int32_t>(t);
  // The cache as the CPU writes it, copied to the device, so both read the same keys/values.
  const std::vector<float> k = randoms(n_pos * n_kv_dim, 2), v = randoms(n_pos * n_kv_dim, 2);
  const size_t cache_bytes = static_cast<size_t>(s.n_blocks * s.block_size * s.row_bytes);
  std::vector<uint8_t> kbytes, vbytes;
  {
    Backend& cpu = *backends().cpu;
    const std::vector<uint8_t> zeros(cache_bytes, 0);
    Buffer kc = put(cpu, zeros), vc = put(cpu, zeros), kb = put(cpu, k), vb = put(cpu, v);
    cpu.store_kv(view_of(type, s, kc, vc), pos.data(), n_pos, n_kv_dim, kb.as<float>(), vb.as<float>());
    kbytes = get<uint8_t>(cpu, kc, cache_bytes);
    vbytes = get<uint8_t>(cpu, vc, cache_bytes);
  }
  std::vector<float> kd(s.n_blocks * s.block_size * n_kv_dim), vd(kd.size());
  for (int64_t slot = 0; slot < s.n_blocks * s.block_size; ++slot) {  // kd, vd: [slot][n_kv_dim]
    for (int64_t h = 0; h < n_head_kv; ++h) {
      const int64_t at = slot * n_kv_dim + h * head_dim;
      type_traits(type).dequantize_row(kbytes.data() + s.offset(slot, h), kd.data() + at, head_dim);
      type_traits(type).dequantize_row(vbytes.data() + s.offset(slot, h), vd.data() + at, head_dim);
    }
  }
  for (const auto& [window, softcap] :
       {std::pair<int64_t, float>{0, 0.0f}, {pick({1, 6, 40}), 0.0f}, {pick({0, 6, 40}), 2.0f}}) {
    AttentionParams params;
    params.n_head = n_head;
    params.n_head_kv = n_head_kv;
    params.head_dim = head_dim;
    params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    params.window = window;
    params.softcap = softcap;
    const std::vector<float> q = randoms(n_rows * n_head * head_dim, 2);
    Pair p;
    for (int side = 0; side < 2; ++side) {
      Backend& be = side == 0 ? *backends().cpu : *backends().dev;
      Buffer kc = put(be, kbytes), vc = put(be, vbytes), qb = put(be, q);
      Buffer ob = be.alloc(sizeof(float) * q.size());
      be.attention(qb.as<float>(), pos.data() + first, n_rows, view_of(type, s, kc, vc), params,
                   ob.as<float>());
      (side == 0 ? p.cpu : p.dev) = get<float>(be, ob, q.size());
    }
    std::vector<double> tol(q.size());
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t at = first + r, lo = window > 0 ? std::max<int64_t>(0, at - window + 1) : 0;
      for (int64_t h = 0; h < n_head; ++h) {
        const int64_t kv0 = (h / (n_head / n_head_kv)) * head_dim;
        double qk_max = 0, vmax = 0, smin = 1e300, smax = -1e300;
        for (int64_t t = lo; t <= at; ++t) {
          const int64_t slot = s.table[t / s.block_size] * s.block_size + t % s.block_size;
          double abs_dot = 0, dot = 0;
          for (int64_t d = 0; d < head_dim; ++d) {
            const double qd = q[(r * n_head + h) * head_dim + d], kd_ = kd[slot * n_kv_dim + kv0 + d];
            abs_dot += std::fabs(qd * kd_);
            dot += qd * kd_;
            vmax = std::max(vmax, std::fabs(double(vd[slot * n_kv_dim + kv0 + d])));
          }
          qk_max = std::max(qk_max, abs_dot);
          smin = std::min(smin, dot * params.scale);
          smax = std::max(smax, dot * params.scale);
        }
        const double n_keys = double(at - lo + 1);
        // Soft-capping only shrinks score differences (|tanh'| <= 1); its tanh adds a few ulp of
        // the cap to each score.
        const double t = vmax * (4 * head_dim * kU * params.scale * qk_max +
                                 (n_keys + 16 + 2 * (smax - smin) + 8 * softcap) * kUlp);
        for (int64_t d = 0; d < head_dim; ++d) tol[(r * n_head + h) * head_dim + d] = t;
      }
    }
    expect_close(p, tol,
                 cat("attention ", dtype_name(type), " heads ", n_head, "/", n_head_kv, "x", head_dim,
                     " rows ", first, "+", n_rows, " window ", window, " softcap ", softcap));
  }
}

TEST(attention_f16) { check_attention(DType::f16); }
TEST(attention_q8_0) { check_attention(DType::q8_0); }

// A device backend records ops and submits them once, at the download that needs their result.
TEST(one_submission_per_download) {
  Backend& be = *backends().dev;
  const std::vector<float> a = randoms(1000), b = randoms(1000);
  Buffer ab = put(be, a), bb = put(be, b), y = be.alloc(4000);
  const int64_t before = be.n_submissions();
  for (int i = 0; i < 5; ++i) be.add(ab.as<float>(), bb.as<float>(), 1000, y.as<float>());
  be.silu_mul(y.as<float>(), bb.as<float>(), 1000, y.as<float>());
  std::vector<float> out(1000);
  be.download(y, 0, out.data(), 4000);
  be.synchronize();  // nothing left to submit
  const int64_t n = be.n_submissions() - before;
  CHECK(n == (be.name() == std::string("cpu") ? 0 : 1));
}

}  // namespace
