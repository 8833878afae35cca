// cpu/matmul.cpp: y = x · Wᵀ for every supported weight type: quantizes the activations once
// (into the caller's workspace), then splits output columns over the thread pool. Decode-shaped
// calls (few rows) stream the weights once (memory-bound): through the GEMM's few-row path over
// weights packed at load (weight_pack.h) where the table has one, else vec_dot per weight row;
// prefill-shaped calls go to the ISA's GEMM, which packs weight panels so one weight read
// serves many rows (compute-bound).
#include "cpu/matmul.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/matmul_kernels.h"

namespace ember::cpu {
namespace {

// From this many rows on, packing a weight panel (one pass of decoding) is cheaper than decoding
// every weight block once per row in vec_dot.
constexpr int64_t kGemmMinRows = 4;

// Up to this many activations are quantized (and tiled) by the calling thread alone: about 15 us
// of work, less than a round trip through the thread pool (decode and verification steps).
constexpr int64_t kInlineQuantizeElements = 32768;

// A prefill-shaped GEMM (from kGemmPartsMinRows rows: compute-bound; decode keeps one stream of
// weights per thread) is cut into kGemmPartsPerThread parts per thread, each with its own panel,
// so that when one core is shared with other work the other threads take more of the panels
// instead of waiting for it (tinyllama Q4_0 pp512, 2 threads on a 2-core VM with one
// other busy process: 210 -> 252 t/s, medians of 9 interleaved runs; on the quiet machine 395 ->
// 397).
constexpr int kGemmPartsPerThread = 4;
constexpr int64_t kGemmPartsMinRows = 32;

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// How one call carves the workspace: [quantized activations][their tiles][a panel per GEMM part],
// each region 64-byte aligned (sizes 0 where the call's path does not use it).
struct ScratchLayout {
  int64_t act_bytes = 0, tiles_bytes = 0, panel_bytes = 0;  // panel_bytes: per part
  int n_parts = 0;
  int64_t total() const { return act_bytes + tiles_bytes + panel_bytes * n_parts; }
};

ScratchLayout scratch_layout(const IsaKernels& kernels, const ActTiling& tiling, bool q8a, bool tiled,
                             bool gemm, int64_t n_rows, int64_t n_in, int n_threads) {
  ScratchLayout l;
  l.n_parts = n_threads > 1 ? n_threads * kGemmPartsPerThread : 1;
  if (q8a) l.act_bytes = round_up(n_rows * (n_in / 32) * int64_t(sizeof(BlockQ8A)), 64);
  if (tiled) l.tiles_bytes = round_up(tiling.bytes(n_rows, n_in), 64);
  if (gemm && kernels.panel_bytes) l.panel_bytes = round_up(kernels.panel_bytes(n_in), 64);
  return l;
}

bool uses_gemm(const TypeKernels& k, int64_t n_rows) {
  return k.gemm != nullptr && (n_rows >= kGemmMinRows || k.gemm_any_rows);
}

}  // namespace

int64_t matmul_exact_min_rows(DType wtype) { return matmul_exact_min_rows(active_kernels(), wtype); }

int64_t matmul_workspace_bytes(int64_t n_rows, int64_t n_in, int n_threads) {
  return matmul_workspace_bytes(active_kernels(), n_rows, n_in, n_threads);
}

bool matmul_supports(DType wtype) { return isa_kernels_scalar().of(wtype).act != ActFormat::none; }

int64_t matmul_exact_min_rows(const IsaKernels& kernels, DType wtype) {
  const TypeKernels& k = kernels.of(wtype);
  // One code path at every row count (vec_dot alone, or a GEMM that takes any count) gives a
  // row the same bits whatever came with it; otherwise rows agree from the GEMM's count on.
  return k.gemm == nullptr || k.gemm_any_rows ? 1 : kGemmMinRows;
}

int64_t matmul_workspace_bytes(const IsaKernels& kernels, int64_t n_rows, int64_t n_in, int n_threads) {
  // The largest of any weight type's needs: q8a activations, tiles where the table has them, panels.
  int64_t bytes = 0;
  for (const ActTiling* tiling : {&kernels.act_tiling, &kernels.float_tiling}) {
    const bool tiled = tiling->used(n_rows, n_in);
    bytes = std::max(bytes,
                     scratch_layout(kernels, *tiling, true, tiled, true, n_rows, n_in, n_threads).total());
  }
  return bytes;
}

const IsaKernels& active_kernels() {
  const IsaKernels* kernels = isa_kernels(active_isa_level());
  return kernels ? *kernels : isa_kernels_scalar();
}

void pack_matmul_weight(const IsaKernels& kernels, DType wtype, const void* w, int64_t n_in, int64_t n_out,
                        void* out, ThreadPool& pool) {
  const WeightPackFn pack = kernels.of(wtype).pack;
  const int64_t n_groups = (n_out + kPackCols - 1) / kPackCols;
  pool.run([&](int ith, int nth) {
    int64_t begin, end;
    split_range(n_groups, ith, nth, &begin, &end);
    if (begin < end) pack(w, n_in, n_out, out, begin, end);
  });
}

void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_rows, float* y,
            ThreadPool& pool, MatmulWorkspace& workspace) {
  matmul_with(active_kernels(), wtype, w, n_in, n_out, x, n_rows, y, pool, workspace);
}

void matmul_many(const MatmulOut* outs, int n_outs, int64_t n_in, const float* x, int64_t n_rows,
                 ThreadPool& pool, MatmulWorkspace& workspace) {
  matmul_many_with(active_kernels(), outs, n_outs, n_in, x, n_rows, pool, workspace);
}

void matmul_with(const IsaKernels& kernels, DType wtype, const void* w, int64_t n_in, int64_t n_out,
                 const float* x, int64_t n_rows, float* y, ThreadPool& pool, MatmulWorkspace& workspace) {
  const MatmulOut out{wtype, w, n_out, y};
  matmul_many_with(kernels, &out, 1, n_in, x, n_rows, pool, workspace);
}

void matmul_columns(const TypeKernels& k, bool use_gemm, const void* w, DType wtype, int64_t n_in,
                    const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t c_begin, int64_t c_end,
                    float* y, int64_t ldy, void* panel, const uint8_t* act_tiles) {
  const auto* w_bytes = static_cast<const uint8_t*>(w);
  const int64_t w_row_bytes = row_bytes(wtype, n_in);
  if (use_gemm) {
    GemmArgs args{w_bytes,       w_row_bytes, n_in, c_begin, c_end, act,
                  act_row_bytes, n_rows,      y,    ldy,     panel, act_tiles};
    k.gemm(args);
    return;
  }
  // Decode without a GEMM: each thread streams its contiguous range of weight rows once; the
  // vec_dot kernels prefetch a fixed distance ahead along that stream (see vec_dot_x86.h).
  for (int64_t c = c_begin; c < c_end; ++c) {
    const uint8_t* w_row = w_bytes + c * w_row_bytes;
    for (int64_t r = 0; r < n_rows; ++r) y[r * ldy + c] = k.vec_dot(n_in, w_row, act + r * act_row_bytes);
  }
}

void matmul_many_with(const IsaKernels& kernels, const MatmulOut* outs, int n_outs, int64_t n_in,
                      const float* x, int64_t n_rows, ThreadPool& pool, MatmulWorkspace& workspace) {
  for (int i = 0; i < n_outs; ++i) {
    const DType wtype = outs[i].wtype;
    const int64_t block = type_traits(wtype).block_size;
    if (kernels.of(wtype).act == ActFormat::none) {
      throw Unsupported(cat("[cpu] matmul: no kernel for weight type ", dtype_name(wtype)));
    }
    if (n_in % block != 0) {
      throw InvalidArgument(cat("[cpu] matmul: n_in ", n_in, " is not a multiple of ", dtype_name(wtype),
                                "'s block size ", block));
    }
  }
  if (n_rows <= 0 || n_outs == 0) return;
  constexpr int kMaxOuts = 8;
  if (n_outs > kMaxOuts) {
    for (int i = 0; i < n_outs; i += kMaxOuts) {
      matmul_many_with(kernels, outs + i, std::min(kMaxOuts, n_outs - i), n_in, x, n_rows, pool, workspace);
    }
    return;
  }
  const TypeKernels& k0 = kernels.of(outs[0].wtype);
  const bool use_gemm = uses_gemm(k0, n_rows);
  // The GEMM's own activation layout, if it has one: [tiles of tiling.tile_rows rows].
  const ActTiling& tiling = is_quantized(k0.act) ? kernels.act_tiling : kernels.float_tiling;
  const bool tiled = use_gemm && k0.act_tiled && tiling.used(n_rows, n_in);
  // Weights share the call only where they take the activations in the same form on the same path.
  for (int i = 1; i < n_outs; ++i) {
    const TypeKernels& k = kernels.of(outs[i].wtype);
    if (k.act != k0.act || uses_gemm(k, n_rows) != use_gemm || (use_gemm && k.act_tiled != k0.act_tiled)) {
      for (int j = 0; j < n_outs; ++j)
        matmul_many_with(kernels, &outs[j], 1, n_in, x, n_rows, pool, workspace);
      return;
    }
  }

  // The only allocation of the call, if any (see MatmulWorkspace), before any kernel runs.
  const ScratchLayout layout = scratch_layout(kernels, tiling, is_quantized(k0.act), tiled, use_gemm, n_rows,
                                              n_in, pool.n_threads());
  uint8_t* const scratch = workspace.reserve(layout.total());
  uint8_t* const act_tiles = scratch + layout.act_bytes;   // [tiling.bytes(n_rows, n_in)]
  uint8_t* const panels = act_tiles + layout.tiles_bytes;  // [layout.n_parts][panel_bytes]

  // Activations in the kernels' format: [n_rows][act_row_bytes], and their tiles where tiled.
  const bool quantized = is_quantized(k0.act);
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  int64_t act_row_bytes = n_in * static_cast<int64_t>(sizeof(float));
  if (quantized) {
    act_row_bytes = (n_in / 32) * static_cast<int64_t>(sizeof(BlockQ8A));
    act = scratch;  // [n_rows][act_row_bytes]
  }
  if (quantized || tiled) {
    // Rows are handed out in whole tiles, so each thread packs the tiles of the rows it just
    // quantized (still in its cache).
    const int64_t unit = tiled ? tiling.tile_rows : 1;
    const int64_t n_units = (n_rows + unit - 1) / unit;
    auto prepare_units = [&](int64_t begin, int64_t end) {
      if (quantized) {
        for (int64_t r = begin * unit; r < std::min(end * unit, n_rows); ++r) {
          kernels.quantize_act(x + r * n_in, reinterpret_cast<BlockQ8A*>(scratch + r * act_row_bytes), n_in,
                               act_blocks_per_scale(k0.act));
        }
      }
      if (tiled) tiling.pack(act, act_row_bytes, n_rows, n_in, begin, end, act_tiles);
    };
    if (n_rows * n_in <= kInlineQuantizeElements) {
      prepare_units(0, n_units);  // a few rows: not worth waking the workers twice
    } else {
      pool.run([&](int ith, int nth) {
        int64_t begin, end;
        split_range(n_units, ith, nth, &begin, &end);
        prepare_units(begin, end);
      });
    }
  }

  // The outputs' columns in units (GEMM panels of gemm_cols columns, or single columns for
  // vec_dot), laid end to end and weighed by their weight bytes: each part of the job takes one
  // contiguous share of those bytes (decode: each thread streams its share once, possibly across
  // two weights).
  struct Span {
    int64_t cols_per_unit, n_units, unit_cost, cost_begin;
  };
  Span spans[kMaxOuts];
  int64_t total_cost = 0, total_units = 0;
  for (int i = 0; i < n_outs; ++i) {
    const int64_t cols = use_gemm ? kernels.of(outs[i].wtype).gemm_cols : 1;
    const int64_t n_units = (outs[i].n_out + cols - 1) / cols;
    spans[i] = {cols, n_units, cols * row_bytes(outs[i].wtype, n_in), total_cost};
    total_cost += n_units * spans[i].unit_cost;
    total_units += n_units;
  }
  const int n_parts = use_gemm && n_rows >= kGemmPartsMinRows
                          ? static_cast<int>(std::min<int64_t>(layout.n_parts, total_units))
                          : pool.n_threads();
  pool.run(n_parts, [&](int ith, int nth) {
    const int64_t cost_lo = total_cost * ith / nth, cost_hi = total_cost * (ith + 1) / nth;
    // Unit u of a span belongs to the part whose cost range holds the cost where u starts.
    auto first_unit_at = [](const Span& s, int64_t cost) {
      const int64_t into = std::max<int64_t>(cost - s.cost_begin, 0);
      return std::min((into + s.unit_cost - 1) / s.unit_cost, s.n_units);
    };
    for (int i = 0; i < n_outs; ++i) {
      const Span& s = spans[i];
      const int64_t u_begin = first_unit_at(s, cost_lo), u_end = first_unit_at(s, cost_hi);
      if (u_begin >= u_end) continue;
      const MatmulOut& out = outs[i];
      const int64_t c_begin = u_begin * s.cols_per_unit, c_end = std::min(u_end * s.cols_per_unit, out.n_out);
      matmul_columns(kernels.of(out.wtype), use_gemm, out.w, out.wtype, n_in, act, act_row_bytes, n_rows,
                     c_begin, c_end, out.y, out.n_out, panels + ith * layout.panel_bytes,
                     tiled ? act_tiles : nullptr);
    }
  });
}

}  // namespace ember::cpu
