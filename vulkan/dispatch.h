// vulkan/dispatch.h: what the op files share — the weight types with shaders, shader names per
// type, and the split of a dispatch's workgroups over a 2-D grid (at most 65535 per dimension;
// shaders recover the flat index with group_index()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "quant/types.h"

namespace ember::vk {

// Types dequant.glsl decodes: matmul weights and get_rows tables. iq2_s, iq3_xxs, iq3_s, iq1_s and
// iq1_m have decoders there but are not built: on lavapipe one iq2_s matmul check ran past 25
// minutes (its 2048-word grid as a shader constant), so they stay refused until the grids move
// to a buffer and the checks run.
inline bool has_weight_shaders(DType t) {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q8_0:
    case DType::iq4_nl:
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
    case DType::iq4_xs:
    case DType::mxfp4:
    case DType::tq1_0:
    case DType::tq2_0:
    case DType::iq2_xxs:
    case DType::iq2_xs: return true;
    default: return false;
  }
}

// "matmul_vec" + q4_0 -> "matmul_vec_q4_0".
inline std::string shader_of(const char* base, DType t) { return std::string(base) + "_" + dtype_name(t); }

struct Grid {
  uint32_t x = 1, y = 1;
};
inline Grid grid(int64_t n_groups) {
  constexpr int64_t kMax = 65535;
  Grid g;
  g.x = static_cast<uint32_t>(std::clamp<int64_t>(n_groups, 0, kMax));
  g.y = static_cast<uint32_t>(n_groups <= kMax ? 1 : (n_groups + kMax - 1) / kMax);
  return g;
}

}  // namespace ember::vk
