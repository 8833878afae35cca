// tokenizer/unicode_tables.h: the shapes of the generated Unicode tables (unicode_tables.cpp,
// written by scripts/gen_unicode_tables.py). Only tokenizer/unicode.cpp reads them.
#pragma once

#include <cstdint>
#include <span>

namespace ember::unicode {

// Code points [first, next run's first) share `flags` (CodepointFlags bits). Sorted, gap-free.
struct CategoryRun {
  uint32_t first;
  uint16_t flags;
};

// lower(cp) = cp + delta for cp = first, first + stride, ..., last.
struct LowercaseRun {
  uint32_t first;
  uint32_t last;
  uint32_t stride;
  int32_t delta;
};

// Every cp in [first, last] decomposes (NFD, nonspacing marks removed) to the one code point base.
struct AccentRun {
  uint32_t first;
  uint32_t last;
  uint32_t base;
};

// A cp whose NFD-minus-nonspacing-marks form is not one code point: n (0..3) code points.
struct AccentSpecial {
  uint32_t cp;
  uint32_t n;
  uint32_t out[3];
};

extern const char* const k_unicode_version;
extern const uint16_t k_ascii_flags[128];
std::span<const CategoryRun> category_runs();
std::span<const LowercaseRun> lowercase_runs();
std::span<const AccentRun> accent_runs();
std::span<const AccentSpecial> accent_special();

}  // namespace ember::unicode
