// cpu/matmul_kernels.h: the per-ISA kernel tables behind cpu::matmul, indexed by weight DType.
// Each ISA file (vec_dot_scalar.cpp, *_avx2.cpp, *_avx512.cpp, gemm_amx.cpp, *_neon.cpp) fills one table;
// matmul.cpp picks the table of the active ISA level. Tests reach every table directly.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/matmul_workspace.h"
#include "cpu/quantize_act.h"
#include "cpu/weight_pack.h"
#include "quant/types.h"

namespace ember::cpu {

// What a weight type's kernels take as activations: floats, or BlockQ8A rows whose blocks have
// their own scales (q8a) or share one per 256-element super-block (q8a_k: kernels that sum a
// K-quant super-block in integers).
enum class ActFormat { none, f32, q8a, q8a_k };

inline bool is_quantized(ActFormat f) { return f == ActFormat::q8a || f == ActFormat::q8a_k; }
// Blocks of a BlockQ8A row that share one scale (quantize_act_row_ref's blocks_per_scale).
inline int act_blocks_per_scale(ActFormat f) { return f == ActFormat::q8a_k ? 8 : 1; }

// Σ over n_in of one weight row (n_in elements of the weight type) times one activation row
// (float[n_in] for ActFormat::f32, BlockQ8A[n_in / 32] for q8a and q8a_k).
using VecDotFn = float (*)(int64_t n_in, const void* w_row, const void* act_row);

// One thread's share of a prefill-shaped matmul: y[r, c] for r < n_rows, c in [col_begin,
// col_end) = act row r · weight row c. The kernel repacks weight rows into `panel` (at least
// panel_bytes(n_in) bytes, 64-byte aligned) so that each weight byte read serves many rows.
struct GemmArgs {
  const uint8_t* w;  // the whole weight matrix: [n_out][w_row_bytes] in the file's layout,
                     // or packed (TypeKernels::pack; column c0's group at c0 * w_row_bytes)
  int64_t w_row_bytes;
  int64_t n_in;
  int64_t col_begin, col_end;
  const uint8_t* act;  // [n_rows][act_row_bytes] activations in the type's ActFormat
  int64_t act_row_bytes;
  int64_t n_rows;
  float* y;  // [n_rows][ldy]
  int64_t ldy;
  void* panel;               // per-thread scratch
  const uint8_t* act_tiles;  // act in the table's ActTiling layout (q8a types); nullptr if none
};
using GemmFn = void (*)(const GemmArgs& args);

// A GEMM layout of the activations in tiles of `tile_rows` rows, made once per matmul (shared by
// every thread) when a table's GEMMs want one: AMX loads 16 rows of one block's quants as one
// tile, which is slow from BlockQ8A rows 44 bytes apart per block; the AVX-512 float GEMMs
// broadcast a tile's R values of one element from one cache line instead of R rows apart.
struct ActTiling {
  int64_t tile_rows = 0;  // 0: the GEMMs read the rows directly
  int64_t min_rows = 0;   // smaller matmuls leave act_tiles null (the GEMMs then read the rows),
  int64_t min_n_in = 0;   // and so do shorter rows
  bool used(int64_t n_rows, int64_t n_in) const {
    return tile_rows > 0 && n_rows >= min_rows && n_in >= min_n_in;
  }
  // Bytes of the whole layout for n_rows rows of n_in elements.
  int64_t (*bytes)(int64_t n_rows, int64_t n_in) = nullptr;
  // Writes tiles [tile_begin, tile_end) of `act` ([n_rows][act_row_bytes] rows in the
  // activation format of the tiling: BlockQ8A for act_tiling, f32 for float_tiling) into `out`
  // (64-byte aligned).
  void (*pack)(const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t n_in, int64_t tile_begin,
               int64_t tile_end, uint8_t* out) = nullptr;
};

// act[n / 32 blocks] = x[n] quantized (bit-identical to quantize_act_row_ref).
using QuantizeActFn = void (*)(const float* x, BlockQ8A* act, int64_t n, int blocks_per_scale);

struct TypeKernels {
  ActFormat act = ActFormat::none;  // none: this ISA has no kernel for the type
  VecDotFn vec_dot = nullptr;
  GemmFn gemm = nullptr;  // nullptr: matmul loops over vec_dot
  int64_t gemm_cols = 1;  // columns per panel; thread shares are multiples of it
  // The GEMM also takes 1..3 rows, and each row's result is then bit-identical whatever the
  // row count (see matmul_exact_min_rows).
  bool gemm_any_rows = false;
  // The GEMM reads the table's ActTiling layout of its activation format (act_tiling or
  // float_tiling) where that tiling is used (ActTiling::used).
  bool act_tiled = false;
  // The layout matmul() reads this type's weights in: nullptr, the file's rows; otherwise the
  // packed layout of weight_pack.h, which this packer writes from the file's rows (once, at
  // load: CpuBackend::prepare_matmul_weight). vec_dot always reads the file's rows.
  WeightPackFn pack = nullptr;
};

inline constexpr int kNumDTypeIds = 40;  // DType raw ids are < 40

struct IsaKernels {
  IsaLevel level = IsaLevel::scalar;
  QuantizeActFn quantize_act = nullptr;
  int64_t (*panel_bytes)(int64_t n_in) = nullptr;  // GEMM scratch per thread
  ActTiling act_tiling;                            // for the q8a GEMMs
  ActTiling float_tiling;                          // for the f32-activation GEMMs
  TypeKernels types[kNumDTypeIds];

  const TypeKernels& of(DType t) const { return types[static_cast<uint32_t>(t)]; }
};

// The table of one ISA level; nullptr if this build has no kernels for it (e.g. avx512 on an
// aarch64 build). Does not check the CPU: callers use isa_supported() / active_isa_level().
const IsaKernels* isa_kernels(IsaLevel level);

// Per-ISA tables, defined in their ISA's files (only those built for this architecture exist).
const IsaKernels& isa_kernels_scalar();
const IsaKernels& isa_kernels_avx2();
const IsaKernels& isa_kernels_avx512();
const IsaKernels& isa_kernels_amx();  // avx512's, with AMX GEMMs for quantized weights
const IsaKernels& isa_kernels_neon();

}  // namespace ember::cpu

namespace ember::cpu {

// cpu::matmul, matmul_many and their queries with an explicit kernel table (tests run every ISA
// this CPU supports through them). matmul_with's w is in the table's layout for wtype: the file's rows,
// or where TypeKernels::pack is set, what pack_matmul_weight made of them.
void matmul_with(const IsaKernels& kernels, DType wtype, const void* w, int64_t n_in, int64_t n_out,
                 const float* x, int64_t n_rows, float* y, ThreadPool& pool, MatmulWorkspace& workspace);
void matmul_many_with(const IsaKernels& kernels, const MatmulOut* outs, int n_outs, int64_t n_in,
                      const float* x, int64_t n_rows, ThreadPool& pool, MatmulWorkspace& workspace);
// y[r, c] (rows ldy floats apart) for r < n_rows, c in [c_begin, c_end) = act row r · weight row
// c of w (`wtype`, in k's layout), on the calling thread: one part's share of a matmul. act is
// [n_rows][act_row_bytes] in k's ActFormat (act_tiles: its tiling, or nullptr); use_gemm: through
// k.gemm (c_begin a multiple of gemm_cols, panel its scratch), else vec_dot per row and column.
void matmul_columns(const TypeKernels& k, bool use_gemm, const void* w, DType wtype, int64_t n_in,
                    const uint8_t* act, int64_t act_row_bytes, int64_t n_rows, int64_t c_begin, int64_t c_end,
                    float* y, int64_t ldy, void* panel, const uint8_t* act_tiles);
int64_t matmul_exact_min_rows(const IsaKernels& kernels, DType wtype);
int64_t matmul_workspace_bytes(const IsaKernels& kernels, int64_t n_rows, int64_t n_in, int n_threads);
// Writes w (the file's rows, {n_in, n_out}) in the layout kernels.of(wtype).pack defines into
// out (packed_weight_bytes(wtype, n_in, n_out) bytes), column groups split over the pool.
void pack_matmul_weight(const IsaKernels& kernels, DType wtype, const void* w, int64_t n_in, int64_t n_out,
                        void* out, ThreadPool& pool);
// The table cpu::matmul uses: the active ISA level's (scalar where this build lacks it).
const IsaKernels& active_kernels();

}  // namespace ember::cpu
