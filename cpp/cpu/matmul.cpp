// cpu/matmul.cpp: y = x · Wᵀ for every supported weight type: quantizes the activations once,
// then splits output columns over the thread pool. Decode-shaped calls (few rows) stream each
// weight row once through vec_dot (memory-bound); prefill-shaped calls go to the ISA's GEMM,
// which repacks weight panels so one weight read serves many rows (compute-bound).
#include "cpu/matmul.h"

#include <algorithm>
#include <new>

#include "core/error.h"
#include "cpu/matmul_kernels.h"

namespace ember::cpu {
namespace {

// From this many rows on, packing a weight panel (one pass of decoding) is cheaper than decoding
// every weight block once per row in vec_dot.
constexpr int64_t kGemmMinRows = 4;

// A 64-byte aligned byte buffer, one allocation per matmul call (never inside the kernels).
class ScratchBuffer {
 public:
  explicit ScratchBuffer(int64_t n_bytes)
      : data_(n_bytes > 0 ? static_cast<uint8_t*>(::operator new(n_bytes, std::align_val_t{64}))
                          : nullptr) {}
  ~ScratchBuffer() {
    if (data_) ::operator delete(data_, std::align_val_t{64});
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_;
};

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

bool matmul_supports(DType wtype) {
  return isa_kernels_scalar().of(wtype).act != ActFormat::none;
}

bool matmul_rows_exact(DType wtype) {
  const IsaKernels* kernels = isa_kernels(active_isa_level());
  const TypeKernels& k = (kernels ? *kernels : isa_kernels_scalar()).of(wtype);
  return k.gemm != nullptr && k.gemm_any_rows;
}

void matmul(DType wtype, const void* w, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_rows, float* y, ThreadPool& pool) {
  const IsaKernels* kernels = isa_kernels(active_isa_level());
  matmul_with(kernels ? *kernels : isa_kernels_scalar(), wtype, w, n_in, n_out, x, n_rows, y, pool);
}

void matmul_with(const IsaKernels& kernels, DType wtype, const void* w, int64_t n_in,
                 int64_t n_out, const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  const TypeKernels& k = kernels.of(wtype);
  const int64_t block = type_traits(wtype).block_size;
  if (k.act == ActFormat::none) {
    throw Unsupported(cat("[cpu] matmul: no kernel for weight type ", dtype_name(wtype)));
  }
  if (n_in % block != 0) {
    throw InvalidArgument(cat("[cpu] matmul: n_in ", n_in, " is not a multiple of ",
                              dtype_name(wtype), "'s block size ", block));
  }
  if (n_rows <= 0 || n_out <= 0) return;
  const auto* w_bytes = static_cast<const uint8_t*>(w);
  const int64_t w_row_bytes = row_bytes(wtype, n_in);

  const bool use_gemm = k.gemm != nullptr && (n_rows >= kGemmMinRows || k.gemm_any_rows);
  // The GEMM's own activation layout, if it has one: [tiles of tiling.tile_rows rows].
  const ActTiling& tiling = kernels.act_tiling;
  const bool tiled = use_gemm && k.act == ActFormat::q8a && tiling.tile_rows > 0 &&
                     n_rows >= tiling.min_rows;
  ScratchBuffer act_tiles(tiled ? tiling.bytes(n_rows, n_in) : 0);

  // Activations in the kernels' format: [n_rows][act_row_bytes].
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  int64_t act_row_bytes = n_in * static_cast<int64_t>(sizeof(float));
  ScratchBuffer act_buffer(k.act == ActFormat::q8a ? n_rows * (n_in / 32) * int64_t(sizeof(BlockQ8A)) : 0);
  if (k.act == ActFormat::q8a) {
    act_row_bytes = (n_in / 32) * static_cast<int64_t>(sizeof(BlockQ8A));
    auto* q = act_buffer.data();
    // Rows are handed out in whole tiles, so each thread packs the tiles of the rows it just
    // quantized (still in its cache).
    const int64_t unit = tiled ? tiling.tile_rows : 1;
    const int64_t n_units = (n_rows + unit - 1) / unit;
    auto quantize_units = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin * unit; r < std::min(end * unit, n_rows); ++r) {
        kernels.quantize_act(x + r * n_in, reinterpret_cast<BlockQ8A*>(q + r * act_row_bytes), n_in);
      }
      if (tiled) tiling.pack(q, act_row_bytes, n_rows, n_in, begin, end, act_tiles.data());
    };
    if (n_rows < 2 * pool.n_threads()) {
      quantize_units(0, n_units);  // a few rows: not worth waking the workers twice
    } else {
      pool.run([&](int ith, int nth) {
        int64_t begin, end;
        split_range(n_units, ith, nth, &begin, &end);
        quantize_units(begin, end);
      });
    }
    act = q;
  }

  if (use_gemm) {
    const int64_t panel_bytes = round_up(kernels.panel_bytes(n_in), 64);
    ScratchBuffer panels(panel_bytes * pool.n_threads());
    const int64_t n_panels = (n_out + k.gemm_cols - 1) / k.gemm_cols;
    pool.run([&](int ith, int nth) {
      int64_t begin, end;
      split_range(n_panels, ith, nth, &begin, &end);
      if (begin == end) return;
      GemmArgs args{w_bytes, w_row_bytes, n_in, begin * k.gemm_cols,
                    std::min(end * k.gemm_cols, n_out), act, act_row_bytes, n_rows,
                    y, n_out, panels.data() + ith * panel_bytes, tiled ? act_tiles.data() : nullptr};
      k.gemm(args);
    });
    return;
  }

  // Decode: each thread streams its contiguous range of weight rows once; the vec_dot kernels
  // prefetch a fixed distance ahead along that stream (see vec_dot_x86.h).
  pool.run([&](int ith, int nth) {
    int64_t begin, end;
    split_range(n_out, ith, nth, &begin, &end);
    for (int64_t c = begin; c < end; ++c) {
      const uint8_t* w_row = w_bytes + c * w_row_bytes;
      for (int64_t r = 0; r < n_rows; ++r) {
        y[r * n_out + c] = k.vec_dot(n_in, w_row, act + r * act_row_bytes);
      }
    }
  });
}

}  // namespace ember::cpu
