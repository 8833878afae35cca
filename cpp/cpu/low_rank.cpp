// cpu/low_rank.cpp: Backend::add_low_rank on the CPU. A pass's LoRA products are small (rank 16
// against 2048 inputs is under 2% of a 1.1B decode step's multiply-adds), so what they cost is
// their jobs on the pool: one matmul per A and per B product, one scatter per B, of every group,
// took 18% of a 16-request decode step on one adapter and 24% on four (2 threads, Zen 4). Here
// every A product of the call (all groups, all outputs of the shared input) is one job, and every
// B product with its scaled sum into the outputs another, both on the float GEMM kernels (f32,
// or f16 where the adapter file is f16).
#include <algorithm>
#include <cstring>

#include "cpu/matmul_kernels.h"
#include "cpu/ops.h"

namespace ember::cpu {
namespace {

// Phase A's unit: up to this many rows of one group, every output's A (each part reads x once
// for the three of q, k and v). 16 decode rows of one adapter make two units, one per thread.
constexpr int64_t kUnitRows = 8;
// Phase B's unit: this many columns of one output (a multiple of every ISA's GEMM columns), every
// group; its rows go through a tile of kTileRows rows on the stack before they are summed in.
// The GEMM writes the tile with masked stores, which a load cannot take from the store queue:
// summing a tile of 64 columns right after it was written stalled on them (that loop alone was
// 2.5% of a 4-adapter decode step, perf); 256 columns leave the stores time to land.
constexpr int64_t kUnitCols = 256;
constexpr int64_t kTileRows = 16;
// Below this many multiply-adds a phase runs on the caller alone (a few microseconds: less than
// a round trip through the pool; one request's decode step).
constexpr int64_t kInlineMacs = int64_t{1} << 18;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Runs the units visit(fn) names, fn(cost, work), as parts of about equal cost on the pool: a unit
// belongs to the part whose share of the total cost holds the cost where it starts. work(part) runs it.
template <typename Visit>
void run_units(ThreadPool& pool, int max_parts, const Visit& visit) {
  int64_t total = 0, n_units = 0;
  visit([&](int64_t cost, const auto&) {
    total += cost;
    ++n_units;
  });
  if (total == 0) return;
  auto part = [&](int ith, int nth) {
    const int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
    int64_t at = 0;
    visit([&](int64_t cost, const auto& work) {
      if (at >= lo && at < hi) work(ith);
      at += cost;
    });
  };
  const int n_parts = static_cast<int>(std::min<int64_t>(max_parts, n_units));
  if (pool.n_threads() == 1 || n_parts == 1 || total < kInlineMacs) {
    part(0, 1);
  } else {
    pool.run(n_parts, part);
  }
}

}  // namespace

void add_low_rank(const LowRankGroup* groups, int n_groups, const LowRankOut* outs, int n_outs,
                  const float* x, int64_t n_in, const LowRankScratch& scratch, ThreadPool& pool,
                  MatmulWorkspace& workspace) {
  const IsaKernels& kernels = active_kernels();
  // Every row count goes the same way (the GEMM where the table has one: f32 and f16 have one or
  // none together), so a row's bits never depend on the rows beside it.
  const bool use_gemm = kernels.of(DType::f32).gemm != nullptr;
  const int max_parts = pool.n_threads() > 1 ? pool.n_threads() * 4 : 1;
  const int64_t panel_bytes = use_gemm && kernels.panel_bytes
                                  ? round_up(std::max(kernels.panel_bytes(n_in),
                                                      kernels.panel_bytes(scratch.max_rank)),
                                             64)
                                  : 0;
  uint8_t* const panels = workspace.reserve(panel_bytes * max_parts);  // [max_parts][panel_bytes]
  const int64_t ld_t = scratch.max_rank;

  // Phase A: t_j[p] = A_j · x[rows[i]] of group row i at scratch row p, each part gathering the
  // rows of its units that are not in place.
  run_units(pool, max_parts, [&](const auto& unit) {
    int64_t begin = 0;
    for (int ig = 0; ig < n_groups; begin += groups[ig].n_rows, ++ig) {
      const LowRankGroup& g = groups[ig];
      int64_t sum_rank = 0;
      for (int j = 0; j < n_outs; ++j) sum_rank += g.pairs[j].rank;
      if (sum_rank == 0) continue;
      for (int64_t r0 = 0; r0 < g.n_rows; r0 += kUnitRows) {
        const int64_t n_rows = std::min(kUnitRows, g.n_rows - r0), p0 = begin + r0;
        unit(n_rows * sum_rank * n_in, [&, r0, n_rows, p0](int part) {
          const float* act = x + (int64_t{g.rows[0]} + r0) * n_in;
          if (!g.contiguous) {
            float* gathered = scratch.x_rows + p0 * n_in;
            for (int64_t r = 0; r < n_rows; ++r) {
              std::memcpy(gathered + r * n_in, x + int64_t{g.rows[r0 + r]} * n_in, sizeof(float) * n_in);
            }
            act = gathered;
          }
          for (int j = 0; j < n_outs; ++j) {
            const LowRankPair& pair = g.pairs[j];
            if (pair.rank == 0) continue;
            matmul_columns(kernels.of(pair.type), use_gemm, pair.a, pair.type, n_in,
                           reinterpret_cast<const uint8_t*>(act), n_in * int64_t(sizeof(float)), n_rows, 0,
                           pair.rank, scratch.t + j * scratch.t_stride + p0 * ld_t, ld_t,
                           panels + part * panel_bytes, nullptr);
          }
        });
      }
    }
  });

  // Phase B: y_j[rows[i], c] += scales[i] · (B_j · t_j[p])[c], a unit of kUnitCols columns of
  // output j over every group.
  run_units(pool, max_parts, [&](const auto& unit) {
    for (int j = 0; j < n_outs; ++j) {
      int64_t sum_rows_rank = 0;
      for (int ig = 0; ig < n_groups; ++ig) sum_rows_rank += groups[ig].n_rows * groups[ig].pairs[j].rank;
      if (sum_rows_rank == 0) continue;
      const LowRankOut& out = outs[j];
      for (int64_t c0 = 0; c0 < out.n_out; c0 += kUnitCols) {
        const int64_t n_cols = std::min(kUnitCols, out.n_out - c0);
        unit(sum_rows_rank * n_cols, [&, j, c0, n_cols](int part) {
          float tile[kTileRows * kUnitCols];  // [kTileRows][kUnitCols] B · t of a few rows
          int64_t begin = 0;
          for (int ig = 0; ig < n_groups; begin += groups[ig].n_rows, ++ig) {
            const LowRankGroup& g = groups[ig];
            const LowRankPair& pair = g.pairs[j];
            if (pair.rank == 0) continue;
            // Columns [c0, c0 + n_cols) of B are columns [0, n_cols) from B's column c0 on.
            const auto* b = static_cast<const uint8_t*>(pair.b) + c0 * row_bytes(pair.type, pair.rank);
            for (int64_t r0 = 0; r0 < g.n_rows; r0 += kTileRows) {
              const int64_t n_rows = std::min(kTileRows, g.n_rows - r0);
              const float* t = scratch.t + j * scratch.t_stride + (begin + r0) * ld_t;
              matmul_columns(kernels.of(pair.type), use_gemm, b, pair.type, pair.rank,
                             reinterpret_cast<const uint8_t*>(t), ld_t * int64_t(sizeof(float)), n_rows, 0,
                             n_cols, tile, kUnitCols, panels + part * panel_bytes, nullptr);
              for (int64_t r = 0; r < n_rows; ++r) {
                float* y = out.y + int64_t{g.rows[r0 + r]} * out.n_out + c0;
                const float s = g.scales[r0 + r];
                const float* tr = tile + r * kUnitCols;
                for (int64_t c = 0; c < n_cols; ++c) y[c] += s * tr[c];
              }
            }
          }
        });
      }
    }
  });
}

}  // namespace ember::cpu
