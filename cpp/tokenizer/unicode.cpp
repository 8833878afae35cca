// tokenizer/unicode.cpp: lookups into the generated Unicode tables (binary searches over
// sorted runs; ASCII has a direct table because it dominates most text).
#include "tokenizer/unicode.h"

#include <algorithm>

#include "tokenizer/unicode_tables.h"

namespace ember::unicode {

CodepointFlags flags(uint32_t cp) {
  if (cp < 128) return {k_ascii_flags[cp]};
  if (cp > 0x10FFFF) return {static_cast<uint16_t>(k_control | k_unassigned)};
  const auto runs = category_runs();
  // The last run whose first code point is <= cp (runs[0].first == 0, so there is one).
  const auto it = std::upper_bound(runs.begin(), runs.end(), cp,
                                   [](uint32_t c, const CategoryRun& r) { return c < r.first; });
  return {std::prev(it)->flags};
}

uint32_t to_lower(uint32_t cp) {
  if (cp < 128) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const auto runs = lowercase_runs();
  const auto it = std::upper_bound(runs.begin(), runs.end(), cp,
                                   [](uint32_t c, const LowercaseRun& r) { return c < r.first; });
  if (it == runs.begin()) return cp;
  const LowercaseRun& r = *std::prev(it);
  if (cp > r.last || (cp - r.first) % r.stride != 0) return cp;
  return static_cast<uint32_t>(static_cast<int64_t>(cp) + r.delta);
}

void append_without_accents(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp < 0xC0) {  // nothing below U+00C0 decomposes
    out.push_back(cp);
    return;
  }
  // Hangul syllables decompose algorithmically into leading, vowel and trailing jamo
  // (Unicode 3.12); none of them is a mark, so all stay.
  constexpr uint32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
  constexpr uint32_t n_v = 21, n_t = 28, n_s = 19 * n_v * n_t;
  if (cp >= s_base && cp < s_base + n_s) {
    const uint32_t s = cp - s_base;
    out.push_back(l_base + s / (n_v * n_t));
    out.push_back(v_base + (s % (n_v * n_t)) / n_t);
    if (s % n_t != 0) out.push_back(t_base + s % n_t);
    return;
  }
  if (flags(cp).is_nonspacing_mark()) return;
  const auto runs = accent_runs();
  const auto it = std::upper_bound(runs.begin(), runs.end(), cp,
                                   [](uint32_t c, const AccentRun& r) { return c < r.first; });
  if (it != runs.begin() && cp <= std::prev(it)->last) {
    out.push_back(std::prev(it)->base);
    return;
  }
  const auto special = accent_special();
  const auto sp = std::lower_bound(special.begin(), special.end(), cp,
                                   [](const AccentSpecial& s, uint32_t c) { return s.cp < c; });
  if (sp != special.end() && sp->cp == cp) {
    out.insert(out.end(), sp->out, sp->out + sp->n);
    return;
  }
  out.push_back(cp);
}

const char* tables_version() { return k_unicode_version; }

}  // namespace ember::unicode
