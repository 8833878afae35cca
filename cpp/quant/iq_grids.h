// quant/iq_grids.h: the codebooks of the i-quants (iq2_xxs ... iq1_m), generated from gguf-py's
// grids into iq_grids.cpp by scripts/gen_iq_grids.py. Row i of a grid is one integer whose byte j
// is value j of codebook entry i: 8 values per row (uint64_t) or 4 (uint32_t).
#pragma once

#include <cstdint>

namespace ember {

// Sign patterns of the 7-bit sign indices: bit j set means element j is negative (bit 7 makes
// the number of negatives even).
extern const uint8_t kIqSigns[128];
extern const uint64_t kIq2xxsGrid[256];  // values 8, 25, 43
extern const uint64_t kIq2xsGrid[512];   // values 8, 25, 43
extern const uint64_t kIq2sGrid[1024];   // values 8, 25, 43
extern const uint32_t kIq3xxsGrid[256];  // values 4, 12, ..., 62
extern const uint32_t kIq3sGrid[512];    // values 1, 3, ..., 15
extern const uint64_t kIq1sGrid[2048];   // values -1, 0, 1 (int8), shared by iq1_s and iq1_m

// Value j of a grid row.
inline int grid_value(uint64_t row, int j) { return static_cast<int8_t>(row >> (8 * j)); }

}  // namespace ember
