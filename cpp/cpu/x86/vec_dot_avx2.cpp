// cpu/x86/vec_dot_avx2.cpp: AVX2 (+FMA, F16C) dot products and the avx2 kernel table.
// Integer products use maddubs (u8 x s8 -> s16 pairs) then madd with ones; maddubs saturates a
// pair at 32767, so types whose u can exceed 127 (q8_0, iq4_nl) go through the signed form
// q = u - 128 with the sign moved onto the activation.
#include "cpu/gemm.h"
#include "cpu/matmul_kernels.h"
#include "cpu/x86/vec_dot_x86.h"

namespace ember::cpu {
namespace {

struct BlockDotAvx2 {
  template <typename F>
  static constexpr int bias() {
    return F::kMaxU <= 127 ? F::kBias : 0;
  }

  template <typename F>
  static __m256i dot(__m256i u, __m256i a) {
    __m256i p;
    if constexpr (F::kMaxU <= 127) {
      p = _mm256_maddubs_epi16(u, a);  // |pair| <= 2 * 127 * 127 < 32767
    } else {
      const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
      p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
    }
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
};

IsaKernels make_table() {
  IsaKernels t = x86_vec_dot_table<BlockDotAvx2>(IsaLevel::avx2, kGemmColsAvx2);
  t.panel_bytes = panel_bytes_avx2;
  t.act_tiling = act_tiling_avx2();
  for (uint32_t i = 0; i < kNumDTypeIds; ++i) {
    if (t.types[i].act != ActFormat::none) t.types[i].gemm = gemm_kernel_avx2(static_cast<DType>(i));
    // The K-quant GEMMs that sum whole super-blocks need their activations scaled per super-block.
    if (gemm_sums_super_blocks_avx2(static_cast<DType>(i))) t.types[i].act = ActFormat::q8a_k;
    // Packed types' GEMMs stream the packed weights for 1..3 rows, with the same bits.
    t.types[i].pack = gemm_weight_packer_avx2(static_cast<DType>(i));
    t.types[i].gemm_any_rows = t.types[i].pack != nullptr;
    t.types[i].act_tiled = gemm_act_tiled_avx2(static_cast<DType>(i));
  }
  return t;
}

}  // namespace

const IsaKernels& isa_kernels_avx2() {
  static const IsaKernels table = make_table();
  return table;
}

}  // namespace ember::cpu
