// cpu/x86/vec_dot_avx512.cpp: AVX-512 (F/BW/VL/DQ + VNNI) dot products and the avx512 kernel table.
// vpdpbusd accumulates u8 x s8 products straight into int32 lanes, so unlike AVX2 no type needs
// the signed detour: every type keeps u = q + kBias and pays the bias through the block sums.
#include "cpu/gemm.h"
#include "cpu/matmul_kernels.h"
#include "cpu/x86/vec_dot_x86.h"

namespace ember::cpu {
namespace {

struct BlockDotVnni {
  template <typename F>
  static constexpr int bias() {
    return F::kBias;
  }

  template <typename F>
  static __m256i dot(__m256i u, __m256i a) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a);
  }
};

IsaKernels make_table() {
  IsaKernels t = x86_vec_dot_table<BlockDotVnni>(IsaLevel::avx512, kGemmColsAvx512);
  t.panel_bytes = panel_bytes_avx512;
  t.float_tiling = float_tiling_avx512();
  for (uint32_t i = 0; i < kNumDTypeIds; ++i) {
    if (t.types[i].act != ActFormat::none) t.types[i].gemm = gemm_kernel_avx512(static_cast<DType>(i));
    t.types[i].pack = gemm_weight_packer_avx512(static_cast<DType>(i));
    // The quantized GEMMs take few rows without panels (gemm_avx512.cpp: gemv_quant), the float GEMMs
    // read their weights packed at load: any row count, the same bits.
    t.types[i].gemm_any_rows = is_quantized(t.types[i].act) || t.types[i].pack != nullptr;
    t.types[i].act_tiled = t.types[i].act == ActFormat::f32;
  }
  return t;
}

}  // namespace

const IsaKernels& isa_kernels_avx512() {
  static const IsaKernels table = make_table();
  return table;
}

}  // namespace ember::cpu
