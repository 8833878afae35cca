// cpu/weight_pack.cpp: the packers of weight_pack.h — byte moves from the file's rows into
// column-interleaved blocks (columns past n_out become zero blocks).
#include "cpu/weight_pack.h"

#include <cstring>

namespace ember::cpu {
namespace {

// What each type's packer copies from one file block into slot c of one packed block.
void put(const BlockQ4_0& x, int c, PackedQ4_0& p) {
  p.d[c] = x.d;
  for (int k = 0; k < 4; ++k) std::memcpy(p.qs[k][c], x.qs + 4 * k, 4);
}

void put(const BlockQ4_1& x, int c, PackedQ4_1& p) {
  p.d[c] = x.d;
  p.m[c] = x.m;
  for (int k = 0; k < 4; ++k) std::memcpy(p.qs[k][c], x.qs + 4 * k, 4);
}

void put(const BlockQ8_0& x, int c, PackedQ8_0& p) {
  p.d[c] = x.d;
  for (int g = 0; g < 8; ++g) {
    for (int i = 0; i < 4; ++i) p.u[g][c][i] = static_cast<uint8_t>(x.qs[4 * g + i] + 128);
  }
}

template <typename Block, typename Packed>
void pack(const void* w, int64_t n_in, int64_t n_out, void* out, int64_t group_begin, int64_t group_end) {
  const int64_t n_blocks = n_in / 32;
  const auto* rows = static_cast<const Block*>(w);  // [n_out][n_blocks]
  auto* packed = static_cast<Packed*>(out);          // [n_groups][n_blocks]
  for (int64_t g = group_begin; g < group_end; ++g) {
    Packed* dst = packed + g * n_blocks;
    std::memset(static_cast<void*>(dst), 0, sizeof(Packed) * n_blocks);
    for (int c = 0; c < kPackCols; ++c) {
      const int64_t col = g * kPackCols + c;
      if (col >= n_out) break;
      const Block* row = rows + col * n_blocks;
      for (int64_t b = 0; b < n_blocks; ++b) put(row[b], c, dst[b]);
    }
  }
}

struct PackerEntry {
  DType type;
  WeightPackFn fn;
};
constexpr PackerEntry kPackers[] = {
    {DType::q4_0, pack<BlockQ4_0, PackedQ4_0>},
    {DType::q4_1, pack<BlockQ4_1, PackedQ4_1>},
    {DType::q8_0, pack<BlockQ8_0, PackedQ8_0>},
};

}  // namespace

WeightPackFn weight_packer(DType type) {
  for (const PackerEntry& e : kPackers) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

}  // namespace ember::cpu
