// tests/cpp/test_matmul.cpp: every matmul kernel (vec_dot, GEMM, activation quantization) of every
// ISA level this CPU runs (capped by EMBER_CPU_ISA), on fresh random data each run, against
//   (a) the scalar int8 reference kernels: same integer math, so only float summation order may
//       differ (tight bound), and
//   (b) dequantize_row + a double-precision dot of the unquantized activations: adds the int8
//       activation rounding error (looser, but still a proven bound),
// and the amx GEMMs against the avx512 ones bit for bit (the engine relies on a row's result not
// depending on which GEMM path or batch size computed it).
// Cases (tests/cpp/harness.h): one per ISA level, each printing "isa LEVEL: N passed, M failed"
// over its checks (a level this CPU or EMBER_CPU_ISA rules out runs nothing and prints no isa
// line), and the public entry point. EMBER_TEST_SEED=<n> replays a run.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/matmul_kernels.h"
#include "harness.h"
#include "quant/blocks.h"
#include "quant/types.h"

using namespace ember;
using namespace ember::cpu;

namespace {

// One workspace serves every call, as in the backend (it grows to the largest case).
MatmulWorkspace& workspace() {
  static MatmulWorkspace ws;
  return ws;
}

// One counted check (the harness's EXPECT: a failure is reported and the case goes on).
void check(bool ok, const std::string& what) { EXPECT(ok, what); }

// Offsets of the f16 scale fields of one block: random bytes there could be inf/NaN, so the test
// overwrites them with finite values (the quants themselves stay uniformly random).
struct ScaleFields {
  DType type;
  std::vector<size_t> offsets;
};

const std::vector<ScaleFields>& scale_fields() {
  static const std::vector<ScaleFields> fields = {
      {DType::q4_0, {offsetof(BlockQ4_0, d)}},
      {DType::q4_1, {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)}},
      {DType::q5_0, {offsetof(BlockQ5_0, d)}},
      {DType::q5_1, {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)}},
      {DType::q8_0, {offsetof(BlockQ8_0, d)}},
      {DType::iq4_nl, {offsetof(BlockIQ4_NL, d)}},
      {DType::q2_k, {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}},
      {DType::q3_k, {offsetof(BlockQ3_K, d)}},
      {DType::q4_k, {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}},
      {DType::q5_k, {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}},
      {DType::q6_k, {offsetof(BlockQ6_K, d)}},
      {DType::iq4_xs, {offsetof(BlockIQ4_XS, d)}},
      {DType::tq1_0, {offsetof(BlockTQ1_0, d)}},
      {DType::tq2_0, {offsetof(BlockTQ2_0, d)}},
      {DType::iq2_xxs, {offsetof(BlockIQ2_XXS, d)}},
      {DType::iq2_xs, {offsetof(BlockIQ2_XS, d)}},
      {DType::iq2_s, {offsetof(BlockIQ2_S, d)}},
      {DType::iq3_xxs, {offsetof(BlockIQ3_XXS, d)}},
      {DType::iq3_s, {offsetof(BlockIQ3_S, d)}},
      {DType::iq1_s, {offsetof(BlockIQ1_S, d)}},
  };
  return fields;
}

std::vector<uint8_t> random_weights(DType type, int64_t n_in, int64_t n_out, std::mt19937_64& rng) {
  const TypeTraits& t = type_traits(type);
  const int64_t n_bytes = row_bytes(type, n_in) * n_out;
  std::vector<uint8_t> w(n_bytes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  std::uniform_int_distribution<int> byte(0, 255);
  if (type == DType::f32 || type == DType::f16 || type == DType::bf16) {
    for (int64_t i = 0; i < n_in * n_out; ++i) {
      const float v = normal(rng);
      if (type == DType::f32) std::memcpy(&w[4 * i], &v, 4);
      const uint16_t h = type == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (type != DType::f32) std::memcpy(&w[2 * i], &h, 2);
    }
    return w;
  }
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  if (type == DType::iq1_m) {  // d's f16 bits are the top nibbles of the four scale words
    for (int64_t blk = 0; blk < n_bytes / t.type_size; ++blk) {
      uint8_t* words = &w[blk * t.type_size + offsetof(BlockIQ1_M, scales)];
      const uint16_t h = f32_to_f16(scale(rng));
      for (int i = 0; i < 4; ++i)
        words[2 * i + 1] = static_cast<uint8_t>((words[2 * i + 1] & 0x0f) | ((h >> (4 * i)) & 15) << 4);
    }
  }
  if (type == DType::mxfp4) {  // E8M0 scales 2^-10 .. 2^-2 (2^(e - 128)), as the f16 scales above
    std::uniform_int_distribution<int> exponent(118, 126);
    for (int64_t blk = 0; blk < n_bytes / t.type_size; ++blk)
      w[blk * t.type_size] = static_cast<uint8_t>(exponent(rng));
  }
  for (const ScaleFields& f : scale_fields()) {
    if (f.type != type) continue;
    for (int64_t blk = 0; blk < n_bytes / t.type_size; ++blk) {
      for (size_t off : f.offsets) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(&w[blk * t.type_size + off], &h, 2);
      }
    }
  }
  return w;
}

// w (the file's rows) in the layout `kernels` reads the type in: packed where the table packs it
// (TypeKernels::pack), as is otherwise. vec_dot always takes the file's rows.
std::vector<uint8_t> kernel_layout(const IsaKernels& kernels, DType type, const std::vector<uint8_t>& w,
                                   int64_t n_in, int64_t n_out, ThreadPool& pool) {
  if (kernels.of(type).pack == nullptr) return w;
  std::vector<uint8_t> packed(packed_weight_bytes(type, n_in, n_out), 0xcd);
  pack_matmul_weight(kernels, type, w.data(), n_in, n_out, packed.data(), pool);
  return packed;
}

// Rows of activations with varied magnitudes, row to row and block to block (so that
// ActFormat::q8a_k rows hold blocks far below their super-block's largest); one block of zeros
// exercises d == 0.
std::vector<float> random_acts(int64_t n_rows, int64_t n_in, std::mt19937_64& rng) {
  std::vector<float> x(n_rows * n_in);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.1f, 10.0f), block_mag(0.02f, 1.0f);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float m = mag(rng);
    float mb = m;
    for (int64_t i = 0; i < n_in; ++i) {
      if (i % 32 == 0) mb = m * block_mag(rng);
      x[r * n_in + i] = normal(rng) * mb;
    }
  }
  if (n_in >= 64) std::memset(&x[32], 0, 32 * sizeof(float));
  return x;
}

// Float error bound of a sum of n rounded terms: |error| <= n * 2^-23 * Σ|terms| (γ_n, with
// head-room for the few roundings inside each block term: products, scale multiplies).
double summation_tolerance(int64_t n_terms, double magnitude) {
  return (static_cast<double>(n_terms) + 16.0) * 0x1p-23 * magnitude + 1e-30;
}

struct Case {
  DType type;
  int64_t n_in, n_out, n_rows;
};

void run_case(const Case& c, const IsaKernels& kernels, ThreadPool& pool, std::mt19937_64& rng) {
  const IsaKernels& ref = isa_kernels_scalar();
  const TypeKernels& k = kernels.of(c.type);
  const TypeKernels& rk = ref.of(c.type);
  const std::string name = std::string(isa_name(kernels.level)) + " " + dtype_name(c.type) +
                           " n_in=" + std::to_string(c.n_in) + " n_out=" + std::to_string(c.n_out) +
                           " n_rows=" + std::to_string(c.n_rows);
  if (k.act == ActFormat::none) {
    check(false, name + ": no kernel");
    return;
  }
  const std::vector<uint8_t> w = random_weights(c.type, c.n_in, c.n_out, rng);
  const std::vector<float> x = random_acts(c.n_rows, c.n_in, rng);
  const int64_t w_row_bytes = row_bytes(c.type, c.n_in);
  const bool quant = is_quantized(k.act);
  const int blocks_per_scale = act_blocks_per_scale(k.act);

  // Reference activations and dequantized weights.
  const int64_t n_blocks = c.n_in / 32;
  std::vector<BlockQ8A> act(quant ? c.n_rows * n_blocks : 0);
  if (quant) {
    for (int64_t r = 0; r < c.n_rows; ++r) {
      quantize_act_row_ref(&x[r * c.n_in], &act[r * n_blocks], c.n_in, blocks_per_scale);
    }
    // The ISA's quantizer must produce the same bytes.
    std::vector<BlockQ8A> simd(n_blocks);
    bool same = true;
    for (int64_t r = 0; r < c.n_rows; ++r) {
      kernels.quantize_act(&x[r * c.n_in], simd.data(), c.n_in, blocks_per_scale);
      same = same && std::memcmp(simd.data(), &act[r * n_blocks], n_blocks * sizeof(BlockQ8A)) == 0;
    }
    check(same, name + ": quantize_act differs from the reference");
  }
  std::vector<float> wf(c.n_in * c.n_out);
  for (int64_t o = 0; o < c.n_out; ++o) {
    type_traits(c.type).dequantize_row(&w[o * w_row_bytes], &wf[o * c.n_in], c.n_in);
  }

  std::vector<float> y(c.n_rows * c.n_out, NAN);
  const std::vector<uint8_t> w_kernel = kernel_layout(kernels, c.type, w, c.n_in, c.n_out, pool);
  matmul_with(kernels, c.type, w_kernel.data(), c.n_in, c.n_out, x.data(), c.n_rows, y.data(), pool,
              workspace());

  int bad_vec = 0, bad_ref = 0, bad_exact = 0;
  double worst_exact = 0.0;
  for (int64_t r = 0; r < c.n_rows; ++r) {
    const void* act_row = quant ? static_cast<const void*>(&act[r * n_blocks]) : &x[r * c.n_in];
    for (int64_t o = 0; o < c.n_out; ++o) {
      const float* wr = &wf[o * c.n_in];
      const float* xr = &x[r * c.n_in];
      // magnitude: Σ|w x̂| with x̂ the activations the kernels see; quant_err: Σ|w| * d_a / 2.
      double exact = 0.0, magnitude = 0.0, quant_err = 0.0;
      for (int64_t i = 0; i < c.n_in; ++i) {
        exact += static_cast<double>(wr[i]) * xr[i];
        const double xq = quant ? double(act[r * n_blocks + i / 32].d) * act[r * n_blocks + i / 32].qs[i % 32]
                                : xr[i];
        magnitude += std::fabs(double(wr[i]) * xq) + std::fabs(double(wr[i]) * xr[i]);
        if (quant) quant_err += std::fabs(double(wr[i])) * act[r * n_blocks + i / 32].d * 0.5;
      }
      const int64_t n_terms = quant ? n_blocks * 2 : c.n_in;
      const double tight = summation_tolerance(n_terms, magnitude);
      const float want = rk.vec_dot(c.n_in, &w[o * w_row_bytes], act_row);
      const float got_vec = k.vec_dot(c.n_in, &w[o * w_row_bytes], act_row);
      const float got = y[r * c.n_out + o];
      if (!(std::fabs(double(got_vec) - want) <= 2 * tight)) ++bad_vec;
      if (!(std::fabs(double(got) - want) <= 2 * tight)) ++bad_ref;
      // 1.01: the scale d is itself rounded, so |x - d q| may exceed d / 2 by a few ulps.
      const double loose = quant_err * 1.01 + 2 * tight;
      const double err = std::fabs(double(got) - exact);
      if (!(err <= loose)) ++bad_exact;
      if (loose > 0) worst_exact = std::fmax(worst_exact, err / loose);
    }
  }
  check(bad_vec == 0, name + ": vec_dot vs scalar reference: " + std::to_string(bad_vec) + " outputs off");
  check(bad_ref == 0, name + ": matmul vs scalar reference: " + std::to_string(bad_ref) + " outputs off");
  check(bad_exact == 0, name + ": matmul vs f64 dot of dequantized weights: " + std::to_string(bad_exact) +
                            " outputs off (worst err/bound " + std::to_string(worst_exact) + ")");
}

// From matmul_exact_min_rows(type) rows on (1 where the GEMM takes any row count), a row's
// output must be the same bits whether it came with few rows or in a batch of 70 (the engine pads
// smaller batches to the first count and relies on it; 70 rows take amx's tile path where amx is
// active, and avx2's int16 GEMM for the packed signed types, which read the packed layout up to
// 64). Where the answer is above 1, one row alone must differ somewhere: otherwise the
// engine would pad for nothing, and a wrong answer would go unnoticed.
void check_rows_exact(const IsaKernels& kernels, ThreadPool& pool, std::mt19937_64& rng,
                      const std::vector<DType>& types) {
  const int64_t kRows = 70;
  for (DType type : types) {
    const int64_t min_rows = matmul_exact_min_rows(kernels, type);
    bool single_differs = false;
    // 1280: past the avx512 float GEMMs' kFloatTileMinIn, so they read their activation tiles.
    for (int64_t n_in : {256, 768, 1280}) {
      for (int64_t n_out : {1, 16, 37, 100}) {
        const std::vector<uint8_t> w = kernel_layout(kernels, type, random_weights(type, n_in, n_out, rng),
                                                     n_in, n_out, pool);
        const std::vector<float> x = random_acts(kRows, n_in, rng);
        std::vector<float> all(kRows * n_out);
        matmul_with(kernels, type, w.data(), n_in, n_out, x.data(), kRows, all.data(), pool, workspace());
        // avx512 packed types: gemv up to 8 or 12 rows, then the GEMM; avx2: the GEMM from 4 rows
        for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 16}) {
          for (int64_t r0 : {int64_t{0}, kRows - n}) {
            std::vector<float> few(n * n_out, NAN);
            matmul_with(kernels, type, w.data(), n_in, n_out, &x[r0 * n_in], n, few.data(), pool,
                        workspace());
            const bool same = std::memcmp(few.data(), &all[r0 * n_out], few.size() * sizeof(float)) == 0;
            if (n == 1 && !same) single_differs = true;
            if (n < min_rows) continue;
            check(same, std::string(isa_name(kernels.level)) + " " + dtype_name(type) +
                            " n_in=" + std::to_string(n_in) + " n_out=" + std::to_string(n_out) + ": " +
                            std::to_string(n) + " rows differ from the same rows among " +
                            std::to_string(kRows) + " (matmul_exact_min_rows says " +
                            std::to_string(min_rows) + ")");
          }
        }
      }
    }
    if (min_rows > 1) {
      check(single_differs, std::string(isa_name(kernels.level)) + " " + dtype_name(type) +
                                ": matmul_exact_min_rows is " + std::to_string(min_rows) +
                                " but one row alone always matched the batch");
    }
  }
}

// amx and avx512 GEMMs must agree exactly: same int32 dots, same float operations in the same
// order. Row counts cover one partial tile, exact tiles, and partial last tiles.
// Small matmuls run the amx table's GEMMs on avx512's code path (below act_tiling.min_rows), so
// a copy of the table with that threshold removed puts every row count through the tile code.
void check_amx_bit_identical(ThreadPool& pool, std::mt19937_64& rng) {
  IsaKernels amx = *isa_kernels(IsaLevel::amx);
  amx.act_tiling.min_rows = 0;
  const IsaKernels& avx512 = *isa_kernels(IsaLevel::avx512);
  const DType small_types[] = {DType::q4_0, DType::q4_1, DType::q5_0,
                               DType::q5_1, DType::q8_0, DType::iq4_nl};
  // (q2_k, q3_k and q6_k: the amx table keeps avx512's GEMM, so there is nothing to compare.)
  const DType k_types[] = {DType::q4_k, DType::q5_k};
  struct Shape {
    int64_t n_in, n_out;
  };
  // n_in: one block, a partial K chunk, more than one chunk (16 blocks); n_out: one panel, a
  // partial panel, panels split unevenly over the threads.
  const Shape small_shapes[] = {{32, 16}, {96, 37}, {544, 50}, {1056, 16}};
  const Shape k_shapes[] = {{256, 16}, {768, 37}, {512, 50}};
  std::vector<Case> cases;
  for (int64_t n_rows : {4, 5, 15, 16, 17, 33, 100}) {
    for (DType t : small_types) {
      for (Shape s : small_shapes) cases.push_back({t, s.n_in, s.n_out, n_rows});
    }
    for (DType t : k_types) {
      for (Shape s : k_shapes) cases.push_back({t, s.n_in, s.n_out, n_rows});
    }
  }
  int failed = 0;
  for (const Case& c : cases) {
    // Both tables read the same layout (amx's is avx512's, GEMMs aside).
    const std::vector<uint8_t> w = kernel_layout(avx512, c.type, random_weights(c.type, c.n_in, c.n_out, rng),
                                                 c.n_in, c.n_out, pool);
    const std::vector<float> x = random_acts(c.n_rows, c.n_in, rng);
    std::vector<float> y_amx(c.n_rows * c.n_out, NAN), y_avx512(c.n_rows * c.n_out, NAN);
    matmul_with(amx, c.type, w.data(), c.n_in, c.n_out, x.data(), c.n_rows, y_amx.data(), pool, workspace());
    matmul_with(avx512, c.type, w.data(), c.n_in, c.n_out, x.data(), c.n_rows, y_avx512.data(), pool,
                workspace());
    int64_t n_diff = 0;
    for (size_t i = 0; i < y_amx.size(); ++i) {
      n_diff += std::memcmp(&y_amx[i], &y_avx512[i], sizeof(float)) != 0;
    }
    failed += n_diff != 0;
    check(n_diff == 0, std::string("amx ") + dtype_name(c.type) + " n_in=" + std::to_string(c.n_in) +
                           " n_out=" + std::to_string(c.n_out) + " n_rows=" + std::to_string(c.n_rows) +
                           ": " + std::to_string(n_diff) + " outputs differ from avx512's bits");
  }
  std::printf("amx == avx512 bit for bit: %d passed, %d failed\n", static_cast<int>(cases.size()) - failed,
              failed);
}

// The run's random generator: EMBER_TEST_SEED replays a run; printed once with the CPU's features.
std::mt19937_64& rng() {
  static std::mt19937_64 generator = [] {
    uint64_t seed = std::random_device{}();
    if (const char* s = std::getenv("EMBER_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
    const CpuFeatures& f = cpu_features();
    std::printf(
        "seed %llu; cpu: avx2=%d fma=%d f16c=%d avx512f=%d bw=%d vl=%d dq=%d vnni=%d avx_vnni=%d bf16=%d "
        "amx_tile=%d amx_int8=%d neon=%d dotprod=%d; active isa %s\n",
        static_cast<unsigned long long>(seed), f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw, f.avx512vl,
        f.avx512dq, f.avx512_vnni, f.avx_vnni, f.avx512_bf16, f.amx_tile, f.amx_int8, f.neon, f.dotprod,
        isa_name(active_isa_level()));
    return std::mt19937_64(seed);
  }();
  return generator;
}

const DType kSmallTypes[] = {DType::q4_0, DType::q4_1,   DType::q5_0, DType::q5_1,
                             DType::q8_0, DType::iq4_nl, DType::mxfp4};
const DType kKTypes[] = {DType::q2_k,   DType::q3_k,    DType::q4_k,  DType::q5_k,    DType::q6_k,
                         DType::iq4_xs, DType::tq1_0,   DType::tq2_0, DType::iq2_xxs, DType::iq2_xs,
                         DType::iq2_s,  DType::iq3_xxs, DType::iq3_s, DType::iq1_s,   DType::iq1_m};
const DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

// Every (type, n_in, n_out, n_rows) the levels run. EMBER_TEST_SHAPES=small: fewer shapes, for
// slow runs under an emulator (scripts/test_neon.sh).
std::vector<Case> all_cases() {
  const char* shapes = std::getenv("EMBER_TEST_SHAPES");
  const bool small = shapes != nullptr && std::strcmp(shapes, "small") == 0;
  const std::vector<int64_t> rows = small ? std::vector<int64_t>{1, 5, 17}
                                          : std::vector<int64_t>{1, 3, 17, 64, 70};
  const std::vector<int64_t> outs = small ? std::vector<int64_t>{1, 19} : std::vector<int64_t>{1, 7, 37};
  const std::vector<int64_t> small_ins = small ? std::vector<int64_t>{96, 256}
                                               : std::vector<int64_t>{96, 256, 544};
  const std::vector<int64_t> k_ins = small ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 768};
  const std::vector<int64_t> float_ins = small ? std::vector<int64_t>{72, 100}
                                               : std::vector<int64_t>{72, 256, 100, 1056};
  std::vector<Case> cases;
  for (int64_t n_rows : rows) {
    for (int64_t n_out : outs) {
      for (DType t : kSmallTypes) {
        for (int64_t n_in : small_ins) cases.push_back({t, n_in, n_out, n_rows});
      }
      for (DType t : kKTypes) {
        for (int64_t n_in : k_ins) cases.push_back({t, n_in, n_out, n_rows});
      }
      for (DType t : kFloatTypes) {
        for (int64_t n_in : float_ins) cases.push_back({t, n_in, n_out, n_rows});
      }
    }
  }
  return cases;
}

// matmul_many gives each output the bits of its own matmul call: weights of one type, of types
// that share the activations' form (q4_k with q6_k: a Q4_K_M layer's q, k, v), and of types that
// do not (f16 with q8_0: run one by one), at decode and prefill row counts, on a pool whose
// threads then take shares that cross from one weight into the next.
void check_matmul_many(const IsaKernels& kernels, ThreadPool& pool, std::mt19937_64& rng) {
  const int64_t n_in = 512;
  const std::vector<std::vector<std::pair<DType, int64_t>>> groups = {
      {{DType::q4_0, 96}, {DType::q4_0, 16}, {DType::q4_0, 16}},
      {{DType::q4_k, 64}, {DType::q6_k, 33}, {DType::q4_k, 48}},
      {{DType::f16, 40}, {DType::q8_0, 24}}};
  for (const auto& group : groups) {
    for (int64_t n_rows : {1, 3, 5, 40}) {
      const std::vector<float> x = random_acts(n_rows, n_in, rng);
      std::vector<std::vector<uint8_t>> weights;
      std::vector<std::vector<float>> alone, together;
      std::vector<MatmulOut> outs;
      for (const auto& [type, n_out] : group) {
        weights.push_back(
            kernel_layout(kernels, type, random_weights(type, n_in, n_out, rng), n_in, n_out, pool));
        alone.emplace_back(n_rows * n_out);
        together.emplace_back(n_rows * n_out, NAN);
        matmul_with(kernels, type, weights.back().data(), n_in, n_out, x.data(), n_rows, alone.back().data(),
                    pool, workspace());
      }
      for (size_t i = 0; i < group.size(); ++i) {
        outs.push_back({group[i].first, weights[i].data(), group[i].second, together[i].data()});
      }
      matmul_many_with(kernels, outs.data(), static_cast<int>(outs.size()), n_in, x.data(), n_rows, pool,
                       workspace());
      for (size_t i = 0; i < group.size(); ++i) {
        const bool same = std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * sizeof(float)) ==
                          0;
        check(same, std::string(isa_name(kernels.level)) + " matmul_many: output " + std::to_string(i) +
                        " (" + dtype_name(group[i].first) + ") of " + std::to_string(n_rows) +
                        " rows differs from its own matmul");
      }
    }
  }
}

// Every check of one ISA level, when this CPU runs it and EMBER_CPU_ISA allows it.
void check_level(IsaLevel level) {
  // Check the CPU before isa_kernels(): building a table runs code compiled for its ISA.
  if (!isa_supported(level) || !isa_within(level, active_isa_level()) || !isa_kernels(level)) {
    std::printf("%s level not run\n", isa_name(level));
    return;
  }
  const IsaKernels& kernels = *isa_kernels(level);
  ThreadPool pool(2);  // odd n_out and panel counts give uneven splits
  for (const Case& c : all_cases()) run_case(c, kernels, pool, rng());
  std::vector<DType> types(std::begin(kSmallTypes), std::end(kSmallTypes));
  types.insert(types.end(), std::begin(kKTypes), std::end(kKTypes));
  types.insert(types.end(), std::begin(kFloatTypes), std::end(kFloatTypes));
  check_rows_exact(kernels, pool, rng(), types);
  check_matmul_many(kernels, pool, rng());
  if (level == IsaLevel::amx) check_amx_bit_identical(pool, rng());
  std::printf("isa %s: %d passed, %d failed\n", isa_name(level), test::n_expects_passed(),
              test::n_expects_failed());
}

}  // namespace

TEST(kernels_scalar) { check_level(IsaLevel::scalar); }
TEST(kernels_avx2) { check_level(IsaLevel::avx2); }
TEST(kernels_avx512) { check_level(IsaLevel::avx512); }
TEST(kernels_amx) { check_level(IsaLevel::amx); }
TEST(kernels_neon) { check_level(IsaLevel::neon); }

// The public entry point runs the active level.
TEST(matmul_runs_the_active_level) {
  ThreadPool pool(2);
  const IsaLevel active = active_isa_level();
  std::vector<uint8_t> w = kernel_layout(active_kernels(), DType::q4_0,
                                         random_weights(DType::q4_0, 256, 5, rng()), 256, 5, pool);
  std::vector<float> x = random_acts(2, 256, rng()), y(10), y_ref(10);
  matmul(DType::q4_0, w.data(), 256, 5, x.data(), 2, y.data(), pool, workspace());
  matmul_with(*isa_kernels(active), DType::q4_0, w.data(), 256, 5, x.data(), 2, y_ref.data(), pool,
              workspace());
  CHECK(y == y_ref);
  CHECK(matmul_supports(DType::q4_k) && matmul_supports(DType::mxfp4) && !matmul_supports(DType::q8_k));
}
