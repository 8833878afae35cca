// tokenizer/regex_patterns.cpp: hand-written equivalents of the pre-tokenizer regexes.
// Each follows the regex's ordered alternation (the first alternative that matches wins, as in
// PCRE, ECMAScript and the `regex` crate), with greedy quantifiers backtracking only where the
// regex would: "\s+(?!\S)" gives back the last whitespace before a non-space, and
// "\s*[\r\n]+" ends at the last line break of a whitespace run.
#include "tokenizer/regex_patterns.h"

#include <cstdint>

#include "tokenizer/utf8.h"

namespace ember {

void CodepointText::assign(std::string_view text) {
  cps.clear();
  flags.clear();
  offsets.clear();
  cps.reserve(text.size());
  flags.reserve(text.size());
  offsets.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    const utf8::Decoded d = utf8::decode(text, pos);
    cps.push_back(d.cp);
    flags.push_back(unicode::flags(d.cp));
    offsets.push_back(pos);
    pos += d.n_bytes;
  }
  offsets.push_back(text.size());
}

namespace patterns {

namespace {

// Character classes of the regexes, as predicates on (code point, flags).
bool is_letter(uint32_t, unicode::CodepointFlags f) { return f.is_letter(); }
bool is_number(uint32_t, unicode::CodepointFlags f) { return f.is_number(); }
bool is_punct(uint32_t, unicode::CodepointFlags f) { return f.is_punctuation(); }
bool is_space(uint32_t, unicode::CodepointFlags f) { return f.is_whitespace(); }
// [^\s\p{L}\p{N}]
bool is_other(uint32_t, unicode::CodepointFlags f) {
  return !(f.is_whitespace() || f.is_letter() || f.is_number());
}
bool is_line_break(uint32_t c, unicode::CodepointFlags) { return c == '\r' || c == '\n'; }

using ClassFn = bool (*)(uint32_t, unicode::CodepointFlags);

bool in_class(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  return pos < end && cls(t.cps[pos], t.flags[pos]);
}

// Length of the run of `cls` starting at pos, at most `limit` (a bounded quantifier must not
// scan the whole run each time, or a long digit string costs O(n^2)).
size_t run(const CodepointText& t, size_t pos, size_t end, ClassFn cls, size_t limit = SIZE_MAX) {
  size_t n = 0;
  while (n < limit && pos + n < end && cls(t.cps[pos + n], t.flags[pos + n])) ++n;
  return n;
}

// " ?X+": an optional leading space (U+0020 only) and one or more of X.
size_t optional_space_then_run(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  if (t.cps[pos] == ' ' && in_class(t, pos + 1, end, cls)) return 1 + run(t, pos + 1, end, cls);
  return run(t, pos, end, cls);
}

// "\s?X+": the optional leading character is any whitespace.
size_t optional_whitespace_then_run(const CodepointText& t, size_t pos, size_t end, ClassFn cls) {
  if (t.flags[pos].is_whitespace() && in_class(t, pos + 1, end, cls)) return 1 + run(t, pos + 1, end, cls);
  return run(t, pos, end, cls);
}

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (ASCII letters only: no other code
// point folds to one of these).
size_t contraction(const CodepointText& t, size_t pos, size_t end, bool ignore_case) {
  if (t.cps[pos] != '\'' || pos + 1 >= end) return 0;
  auto at = [&](size_t k) { return ignore_case ? ascii_lower(t.cps[pos + k]) : t.cps[pos + k]; };
  const uint32_t c1 = at(1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t c2 = at(2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ over a whitespace run of n code points starting at pos: a run followed by
// a non-space gives that last whitespace to the next match, unless it is the only one.
size_t whitespace_run(const CodepointText& t, size_t pos, size_t end) {
  const size_t n = run(t, pos, end, is_space);
  if (n > 1 && pos + n < end) return n - 1;
  return n;
}

// The Llama 3 family, with at most max_digits numbers per match.
size_t llama3_like(const CodepointText& t, size_t pos, size_t end, size_t max_digits) {
  if (size_t n = contraction(t, pos, end, /*ignore_case=*/true)) return n;
  const uint32_t c = t.cps[pos];
  const unicode::CodepointFlags f = t.flags[pos];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (f.is_letter()) return run(t, pos, end, is_letter);
  if (c != '\r' && c != '\n' && !f.is_number() && in_class(t, pos + 1, end, is_letter)) {
    return 1 + run(t, pos + 1, end, is_letter);
  }
  // \p{N}{1,max_digits}
  if (f.is_number()) return run(t, pos, end, is_number, max_digits);
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  if (is_other(c, f) || (c == ' ' && in_class(t, pos + 1, end, is_other))) {
    const size_t n = optional_space_then_run(t, pos, end, is_other);
    return n + run(t, pos + n, end, is_line_break);
  }
  // \s*[\r\n]+: up to the last line break of the whitespace run
  const size_t n_space = run(t, pos, end, is_space);
  for (size_t k = n_space; k > 0; --k) {
    if (is_line_break(t.cps[pos + k - 1], t.flags[pos + k - 1])) return k;
  }
  return whitespace_run(t, pos, end);
}

}  // namespace

size_t gpt2(const CodepointText& t, size_t pos, size_t end) {
  if (size_t n = contraction(t, pos, end, /*ignore_case=*/false)) return n;
  for (ClassFn cls : {is_letter, is_number, is_other}) {
    if (in_class(t, pos, end, cls) || (t.cps[pos] == ' ' && in_class(t, pos + 1, end, cls))) {
      return optional_space_then_run(t, pos, end, cls);
    }
  }
  return whitespace_run(t, pos, end);
}

size_t llama3(const CodepointText& t, size_t pos, size_t end) { return llama3_like(t, pos, end, 3); }

size_t qwen2(const CodepointText& t, size_t pos, size_t end) { return llama3_like(t, pos, end, 1); }

size_t newline(const CodepointText& t, size_t pos, size_t end) {
  return is_line_break(t.cps[pos], t.flags[pos]) ? 1 : 0;
}

size_t space_letters(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_run(t, pos, end, is_letter);
}

size_t space_punctuation(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_run(t, pos, end, is_punct);
}

size_t cjk_run(const CodepointText& t, size_t pos, size_t end) {
  // The ranges include some whitespace (U+2000.., U+3000), which matches too, as in Hugging
  // Face's tokenizer (llama.cpp's std::wregex version blanks it first and would not match it).
  return run(t, pos, end, [](uint32_t c, unicode::CodepointFlags) {
    return (c >= 0x0800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF);
  });
}

size_t one_number(const CodepointText& t, size_t pos, size_t end) { return t.flags[pos].is_number() ? 1 : 0; }

size_t numbers(const CodepointText& t, size_t pos, size_t end) { return run(t, pos, end, is_number); }

size_t three_ascii_digits(const CodepointText& t, size_t pos, size_t end) {
  if (pos + 3 > end) return 0;
  for (size_t k = 0; k < 3; ++k) {
    if (t.cps[pos + k] < '0' || t.cps[pos + k] > '9') return 0;
  }
  return 3;
}

size_t punctuation_run(const CodepointText& t, size_t pos, size_t end) {
  return run(t, pos, end, [](uint32_t c, unicode::CodepointFlags f) {
    return f.is_punctuation() || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|';
  });
}

size_t punctuation_run_falcon(const CodepointText& t, size_t pos, size_t end) {
  return run(t, pos, end, [](uint32_t c, unicode::CodepointFlags f) {
    return f.is_punctuation() || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|' || c == '`';
  });
}

size_t bloom(const CodepointText& t, size_t pos, size_t end) {
  constexpr ClassFn allowed = [](uint32_t c, unicode::CodepointFlags f) {
    switch (c) {
      case '(':
      case ')':
      case '|':
      case '.':
      case ',':
      case '!':
      case '?':
      case 0x2026:
      case 0x3002:
      case 0xFF0C:
      case 0x3001:
      case 0x0964:
      case 0x06D4:
      case 0x060C: return false;
      default: return !f.is_whitespace();
    }
  };
  return optional_space_then_run(t, pos, end, allowed);
}

}  // namespace patterns
}  // namespace ember
