// tokenizer/regex_match.h: the building blocks the hand-written regex matchers share —
// character classes as predicates, runs of a class, and the alternatives many regexes repeat
// (contractions, whitespace runs, symbol runs). Internal to the regex_patterns*.cpp files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "tokenizer/regex_patterns.h"

namespace ember::patterns::match {

using ClassFn = bool (*)(uint32_t, unicode::CodepointFlags);

inline bool is_letter(uint32_t, unicode::CodepointFlags f) { return f.is_letter(); }
inline bool is_number(uint32_t, unicode::CodepointFlags f) { return f.is_number(); }
inline bool is_decimal(uint32_t, unicode::CodepointFlags f) { return f.is_decimal(); }
inline bool is_punct(uint32_t, unicode::CodepointFlags f) { return f.is_punctuation(); }
inline bool is_space(uint32_t, unicode::CodepointFlags f) { return f.is_whitespace(); }
inline bool is_line_break(uint32_t c, unicode::CodepointFlags) { return c == '\r' || c == '\n'; }
inline bool is_ascii_letter(uint32_t c, unicode::CodepointFlags) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
// [\p{L}\p{M}]
inline bool is_letter_or_mark(uint32_t, unicode::CodepointFlags f) { return f.is_letter() || f.is_mark(); }
// [^\s\p{L}\p{N}]
inline bool is_other(uint32_t, unicode::CodepointFlags f) {
  return !(f.is_whitespace() || f.is_letter() || f.is_number());
}

inline bool in_class(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  return pos < end && cls(t.cps[pos], t.flags[pos]);
}

// Length of the run of `cls` starting at pos, at most `limit` (a bounded quantifier must not
// scan the whole run each time, or a long digit string costs O(n^2)).
inline size_t run(const CodepointText& t, size_t pos, size_t end, ClassFn cls, size_t limit = SIZE_MAX) {
  size_t n = 0;
  while (n < limit && pos + n < end && cls(t.cps[pos + n], t.flags[pos + n])) ++n;
  return n;
}

// " ?X+": an optional leading space (U+0020 only) and one or more of X.
inline size_t optional_space_then_run(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  if (t.cps[pos] == ' ' && in_class(t, pos + 1, end, cls)) return 1 + run(t, pos + 1, end, cls);
  return run(t, pos, end, cls);
}

// "\s?X+": the optional leading character is any whitespace.
inline size_t optional_whitespace_then_run(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  if (t.flags[pos].is_whitespace() && in_class(t, pos + 1, end, cls)) return 1 + run(t, pos + 1, end, cls);
  return run(t, pos, end, cls);
}

// A character class written as inclusive code point ranges ("[一-龥぀-ゟ]"), sorted by `first`.
struct Range {
  uint32_t first, last;
};

inline bool in_ranges(std::span<const Range> ranges, uint32_t c) {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                                   [](uint32_t x, const Range& r) { return x < r.first; });
  return it != ranges.begin() && c <= std::prev(it)->last;
}

inline size_t range_run(const CodepointText& t, size_t pos, size_t end, std::span<const Range> ranges) {
  size_t n = 0;
  while (pos + n < end && in_ranges(ranges, t.cps[pos + n])) ++n;
  return n;
}

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (ASCII letters only: no other code
// point folds to one of these).
size_t contraction(const CodepointText& t, size_t pos, size_t end, bool ignore_case);

// \s+(?!\S)|\s+ : a whitespace run followed by a non-space gives that last whitespace to the
// next match, unless it is the only one.
size_t whitespace_run(const CodepointText& t, size_t pos, size_t end);

// \s*[\r\n]+|\s+(?!\S)|\s+ : up to the last line break of a whitespace run, else as above.
// (\s*[\r\n] without the + ends at the same place.)
size_t line_breaks_or_whitespace(const CodepointText& t, size_t pos, size_t end);

// What may follow a run of symbols: "" , "[\r\n]*", "[\r\n/]*" or "[\r\n/]?".
enum class Tail { none, line_breaks, line_breaks_or_slashes, one_line_break_or_slash };

// " ?X+" then the tail.
size_t symbols_then_tail(const CodepointText& t, size_t pos, size_t end, ClassFn cls, Tail tail);

}  // namespace ember::patterns::match
