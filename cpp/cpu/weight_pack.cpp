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

void put(const BlockQ4_K& x, int c, PackedQ4_K& p) {
  std::memcpy(&p.dm[c], &x, 4);  // d, dmin
  for (int q = 0; q < 3; ++q) std::memcpy(&p.sc[q][c], x.scales + 4 * q, 4);
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 8; ++k) std::memcpy(p.qs[i][k][c], x.qs + 32 * i + 4 * k, 4);
  }
}

void put(const BlockQ6_K& x, int c, PackedQ6_K& p) {
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < 16; ++m) std::memcpy(p.ql[h][m][c], x.ql + 64 * h + 4 * m, 4);
    for (int g = 0; g < 8; ++g) std::memcpy(p.qh[h][g][c], x.qh + 32 * h + 4 * g, 4);
  }
  for (int q = 0; q < 4; ++q) std::memcpy(&p.sc[q][c], x.scales + 4 * q, 4);
  p.d[c] = x.d;
}

template <typename T>
void put(const T& x, int c, PackedFloat<T>& p) {
  p.v[c] = x;
}

// kElements: weights per Block (32, or 256 for K-quants, 1 for floats).
template <typename Block, typename Packed, int64_t kElements>
void pack(const void* w, int64_t n_in, int64_t n_out, void* out, int64_t group_begin, int64_t group_end) {
  const int64_t n_blocks = n_in / kElements;        // Blocks per row
  const auto* rows = static_cast<const Block*>(w);  // [n_out][n_blocks]
  auto* packed = static_cast<Packed*>(out);         // [n_groups][n_blocks]
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
    {DType::q4_0, pack<BlockQ4_0, PackedQ4_0, 32>},
    {DType::q4_1, pack<BlockQ4_1, PackedQ4_1, 32>},
    {DType::q8_0, pack<BlockQ8_0, PackedQ8_0, 32>},
    {DType::q4_k, pack<BlockQ4_K, PackedQ4_K, 256>},
    {DType::q6_k, pack<BlockQ6_K, PackedQ6_K, 256>},
    {DType::f32, pack<float, PackedFloat<float>, 1>},
    {DType::f16, pack<uint16_t, PackedFloat<uint16_t>, 1>},
    {DType::bf16, pack<uint16_t, PackedFloat<uint16_t>, 1>},
};

}  // namespace

WeightPackFn weight_packer(DType type) {
  for (const PackerEntry& e : kPackers) {
    if (e.type == type) return e.fn;
  }
  return nullptr;
}

}  // namespace ember::cpu
