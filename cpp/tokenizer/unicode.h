// tokenizer/unicode.h: per-code-point properties the pre-tokenizers and WordPiece need —
// general category groups (the regex classes \p{L}, \p{N}, ...), White_Space (\s), letter case,
// simple lower-casing and accent stripping. Backed by generated tables (unicode_tables.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace ember::unicode {

// Bits of CodepointFlags::bits; scripts/gen_unicode_tables.py writes the same values.
enum : uint16_t {
  k_number = 1 << 0,           // \p{N}: Nd, Nl, No
  k_letter = 1 << 1,           // \p{L}: Lu, Ll, Lt, Lm, Lo
  k_separator = 1 << 2,        // \p{Z}: Zs, Zl, Zp
  k_mark = 1 << 3,             // \p{M}: Mn, Mc, Me
  k_punctuation = 1 << 4,      // \p{P}: Pc, Pd, Ps, Pe, Pi, Pf, Po
  k_symbol = 1 << 5,           // \p{S}: Sm, Sc, Sk, So
  k_control = 1 << 6,          // \p{C}: Cc, Cf, Cs, Co, Cn
  k_whitespace = 1 << 7,       // the White_Space property, what \s matches
  k_nonspacing_mark = 1 << 8,  // Mn
  k_unassigned = 1 << 9,       // Cn
  k_upper = 1 << 10,           // Lu, Lt (cased letters that are not lower case)
  k_lower = 1 << 11,           // Ll
  k_decimal = 1 << 12,         // Nd: \d
};

struct CodepointFlags {
  uint16_t bits = 0;

  bool is_number() const { return bits & k_number; }
  bool is_letter() const { return bits & k_letter; }
  bool is_separator() const { return bits & k_separator; }
  bool is_mark() const { return bits & k_mark; }
  bool is_punctuation() const { return bits & k_punctuation; }
  bool is_symbol() const { return bits & k_symbol; }
  bool is_control() const { return bits & k_control; }
  bool is_whitespace() const { return bits & k_whitespace; }
  bool is_nonspacing_mark() const { return bits & k_nonspacing_mark; }
  bool is_upper() const { return bits & k_upper; }
  bool is_lower() const { return bits & k_lower; }
  bool is_decimal() const { return bits & k_decimal; }
};

// Flags of cp; code points past U+10FFFF get those of an unassigned one.
CodepointFlags flags(uint32_t cp);

// Simple lower-case mapping (cp itself when it has none).
uint32_t to_lower(uint32_t cp);

// Appends cp's canonical decomposition (NFD) without its nonspacing marks: "é" -> "e",
// a combining accent -> nothing, "가" -> its two jamo. What BERT's accent stripping does.
void append_without_accents(uint32_t cp, std::vector<uint32_t>& out);

// The Unicode version the tables were generated from, e.g. "14.0.0".
const char* tables_version();

}  // namespace ember::unicode
