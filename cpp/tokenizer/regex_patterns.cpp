// tokenizer/regex_patterns.cpp: hand-written equivalents of the GPT-2 and Llama 3 family of
// pre-tokenizer regexes and of the short single-purpose ones (digits, punctuation, newlines).
// Each follows the regex's ordered alternation (the first alternative that matches wins, as in
// PCRE, ECMAScript and the `regex` crate), with greedy quantifiers backtracking only where the
// regex would: "\s+(?!\S)" gives back the last whitespace before a non-space, and
// "\s*[\r\n]+" ends at the last line break of a whitespace run.
#include "tokenizer/regex_patterns.h"

#include <algorithm>
#include <cstdint>

#include "tokenizer/regex_match.h"
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

namespace match {

namespace {
uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
}  // namespace

size_t contraction(const CodepointText& t, size_t pos, size_t end, bool ignore_case) {
  if (pos >= end || t.cps[pos] != '\'' || pos + 1 >= end) return 0;
  auto at = [&](size_t k) { return ignore_case ? ascii_lower(t.cps[pos + k]) : t.cps[pos + k]; };
  const uint32_t c1 = at(1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t c2 = at(2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

size_t whitespace_run(const CodepointText& t, size_t pos, size_t end) {
  const size_t n = run(t, pos, end, is_space);
  if (n > 1 && pos + n < end) return n - 1;
  return n;
}

size_t line_breaks_or_whitespace(const CodepointText& t, size_t pos, size_t end) {
  const size_t n_space = run(t, pos, end, is_space);
  for (size_t k = n_space; k > 0; --k) {
    if (is_line_break(t.cps[pos + k - 1], t.flags[pos + k - 1])) return k;
  }
  return whitespace_run(t, pos, end);
}

size_t symbols_then_tail(const CodepointText& t, size_t pos, size_t end, ClassFn cls, Tail tail) {
  if (!in_class(t, pos, end, cls) && !(t.cps[pos] == ' ' && in_class(t, pos + 1, end, cls))) return 0;
  const size_t n = optional_space_then_run(t, pos, end, cls);
  switch (tail) {
    case Tail::none: return n;
    case Tail::line_breaks: return n + run(t, pos + n, end, is_line_break);
    case Tail::line_breaks_or_slashes:
      return n + run(t, pos + n, end,
                     [](uint32_t c, unicode::CodepointFlags) { return c == '\r' || c == '\n' || c == '/'; });
    case Tail::one_line_break_or_slash: {
      const bool one = pos + n < end &&
                       (t.cps[pos + n] == '\r' || t.cps[pos + n] == '\n' || t.cps[pos + n] == '/');
      return n + (one ? 1 : 0);
    }
  }
  return n;
}

}  // namespace match

namespace {

using namespace match;

// The variations of the Llama 3 regex:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?WORD|\p{N}{1,max_digits}| ?OTHER+TAIL|
//   \s*[\r\n]+|\s+(?!\S)|\s+
struct Llama3Options {
  bool contractions = true;
  // WORD: \p{L}+, or [\p{L}\p{M}]+ with OTHER = [^\s\p{L}\p{M}\p{N}] (Qwen3.5), or
  // (?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+, letters and marks with single spaces inside (EXAONE MoE).
  enum class Word { letters, letters_and_marks, spaced_letters } word = Word::letters;
  size_t max_digits = 3;
  Tail tail = Tail::line_breaks;
  // JAIS 2 spells \s+(?!\S) as \s{512}(?!\S)|\s{256}(?!\S)|...|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}.
  bool power_of_two_whitespace = false;
};

// \s{k}(?!\S) for k = 512, 256, ..., 4, then \s{1,2}(?!\S), then \s{1}, over a whitespace run
// of n code points starting at pos (no line breaks in it: those were matched before).
size_t power_of_two_whitespace(const CodepointText& t, size_t pos, size_t end) {
  const size_t n = run(t, pos, end, is_space);
  const bool run_ends_text = pos + n == end;
  // \s{k}(?!\S) matches when more whitespace follows the k, or the run ends the text.
  auto fits = [&](size_t k) { return n > k || (n == k && run_ends_text); };
  for (size_t k = 512; k >= 4; k /= 2) {
    if (fits(k)) return k;
  }
  if (fits(2)) return 2;
  return 1;  // \s{1,2}(?!\S) with one, or \s{1}
}

// (?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+ from pos, which holds a letter.
size_t spaced_letters(const CodepointText& t, size_t pos, size_t end) {
  auto is_mark = [](uint32_t, unicode::CodepointFlags f) { return f.is_mark(); };
  size_t k = pos;
  while (true) {
    if (in_class(t, k, end, is_letter)) {
      k += 1 + run(t, k + 1, end, is_mark);
    } else if (k < end && t.cps[k] == ' ' && in_class(t, k + 1, end, is_letter) && k > pos) {
      k += 2 + run(t, k + 2, end, is_mark);
    } else {
      return k - pos;
    }
  }
}

size_t llama3_family(const CodepointText& t, size_t pos, size_t end, const Llama3Options& o) {
  if (o.contractions) {
    if (size_t n = contraction(t, pos, end, /*ignore_case=*/true)) return n;
  }
  const uint32_t c = t.cps[pos];
  const unicode::CodepointFlags f = t.flags[pos];
  // [^\r\n\p{L}\p{N}]?WORD: the optional character is tried first, then the word alone.
  const bool may_lead = c != '\r' && c != '\n' && !f.is_letter() && !f.is_number();
  switch (o.word) {
    case Llama3Options::Word::letters:
      if (f.is_letter()) return run(t, pos, end, is_letter);
      if (may_lead && in_class(t, pos + 1, end, is_letter)) return 1 + run(t, pos + 1, end, is_letter);
      break;
    case Llama3Options::Word::letters_and_marks:
      if (may_lead && in_class(t, pos + 1, end, is_letter_or_mark)) {
        return 1 + run(t, pos + 1, end, is_letter_or_mark);
      }
      if (f.is_letter() || f.is_mark()) return run(t, pos, end, is_letter_or_mark);
      break;
    case Llama3Options::Word::spaced_letters:
      if (may_lead && in_class(t, pos + 1, end, is_letter)) return 1 + spaced_letters(t, pos + 1, end);
      if (f.is_letter()) return spaced_letters(t, pos, end);
      break;
  }
  // \p{N}{1,max_digits}
  if (f.is_number()) return run(t, pos, end, is_number, o.max_digits);
  // ?OTHER+TAIL
  const ClassFn other =
      o.word == Llama3Options::Word::letters_and_marks
          ? [](uint32_t,
               unicode::CodepointFlags
                   g) { return !(g.is_whitespace() || g.is_letter() || g.is_mark() || g.is_number()); }
          : is_other;
  if (size_t n = symbols_then_tail(t, pos, end, other, o.tail)) return n;
  // \s*[\r\n]+, then the whitespace alternatives
  if (o.power_of_two_whitespace) {
    const size_t n_space = run(t, pos, end, is_space);
    for (size_t k = n_space; k > 0; --k) {
      if (is_line_break(t.cps[pos + k - 1], t.flags[pos + k - 1])) return k;
    }
    return n_space > 0 ? power_of_two_whitespace(t, pos, end) : 0;
  }
  return line_breaks_or_whitespace(t, pos, end);
}

constexpr Llama3Options k_llama3{};
constexpr Llama3Options k_qwen2{.max_digits = 1};
constexpr Llama3Options k_qwen35{.word = Llama3Options::Word::letters_and_marks, .max_digits = 1};
constexpr Llama3Options k_ufakzeka{.contractions = false, .max_digits = 1};
constexpr Llama3Options k_seed_coder{.max_digits = 1, .tail = Tail::none};
constexpr Llama3Options k_minicpm5{.max_digits = SIZE_MAX};
constexpr Llama3Options k_jais2{.power_of_two_whitespace = true};
constexpr Llama3Options k_exaone_moe{
    .word = Llama3Options::Word::spaced_letters, .max_digits = 1, .tail = Tail::one_line_break_or_slash};

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

size_t llama3(const CodepointText& t, size_t pos, size_t end) { return llama3_family(t, pos, end, k_llama3); }
size_t qwen2(const CodepointText& t, size_t pos, size_t end) { return llama3_family(t, pos, end, k_qwen2); }
size_t qwen35(const CodepointText& t, size_t pos, size_t end) { return llama3_family(t, pos, end, k_qwen35); }
size_t ufakzeka(const CodepointText& t, size_t pos, size_t end) {
  return llama3_family(t, pos, end, k_ufakzeka);
}
size_t seed_coder(const CodepointText& t, size_t pos, size_t end) {
  return llama3_family(t, pos, end, k_seed_coder);
}
size_t minicpm5(const CodepointText& t, size_t pos, size_t end) {
  return llama3_family(t, pos, end, k_minicpm5);
}
size_t jais2(const CodepointText& t, size_t pos, size_t end) { return llama3_family(t, pos, end, k_jais2); }
size_t exaone_moe(const CodepointText& t, size_t pos, size_t end) {
  return llama3_family(t, pos, end, k_exaone_moe);
}

size_t newline(const CodepointText& t, size_t pos, size_t end) {
  return is_line_break(t.cps[pos], t.flags[pos]) ? 1 : 0;
}

size_t newline_runs(const CodepointText& t, size_t pos, size_t end) {
  const bool newline = t.cps[pos] == '\n';
  size_t n = 1;
  while (pos + n < end && (t.cps[pos + n] == '\n') == newline) ++n;
  return n;
}

size_t non_whitespace_run(const CodepointText& t, size_t pos, size_t end) {
  size_t n = 0;
  while (pos + n < end && !t.flags[pos + n].is_whitespace()) ++n;
  return n;
}

size_t space_letters(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_run(t, pos, end, is_letter);
}

size_t space_punctuation(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_run(t, pos, end, is_punct);
}

size_t trailing_whitespace(const CodepointText& t, size_t pos, size_t end) {
  // A run that does not reach the end fails at every one of its positions; when the code point
  // before pos is whitespace, the search already failed there (or pos starts a segment whose
  // whole-segment match would change nothing), so answer at once instead of rescanning: O(n).
  if (!t.flags[pos].is_whitespace() || (pos > 0 && t.flags[pos - 1].is_whitespace())) return 0;
  const size_t n = run(t, pos, end, is_space);
  return pos + n == end ? n : 0;
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

size_t numbers_up_to_3(const CodepointText& t, size_t pos, size_t end) {
  return run(t, pos, end, is_number, 3);
}

namespace {
// Cuts each run of `cls` in [begin, end) into groups of three from the right, the first group
// taking what is left over ("1234567": "1", "234", "567"); the text between runs stays whole.
// `needs_boundary`: only a run that ends at \b (the end, or a character outside \w, that is
// [\p{L}\p{M}\p{N}_]) is cut; inside a run there is no boundary, so no match starts there.
void cut_runs_in_threes(const CodepointText& t, size_t begin, size_t end, ClassFn cls, bool needs_boundary,
                        std::vector<std::pair<size_t, size_t>>& out) {
  size_t gap = begin;
  for (size_t p = begin; p < end;) {
    const size_t n = run(t, p, end, cls);
    if (n == 0) {
      ++p;
      continue;
    }
    const size_t q = p + n;
    const unicode::CodepointFlags f = q < end ? t.flags[q] : unicode::CodepointFlags{};
    const bool boundary = q == end || !(f.is_letter() || f.is_mark() || f.is_number() || t.cps[q] == '_');
    if (!needs_boundary || boundary) {
      if (gap < p) out.emplace_back(gap, p);
      for (size_t g = p, k = n % 3 == 0 ? 3 : n % 3; g < q; g += k, k = 3) out.emplace_back(g, g + k);
      gap = q;
    }
    p = q;
  }
  if (gap < end) out.emplace_back(gap, end);
}
}  // namespace

void digit_groups(const CodepointText& t, size_t begin, size_t end,
                  std::vector<std::pair<size_t, size_t>>& out) {
  cut_runs_in_threes(t, begin, end, is_number, /*needs_boundary=*/false, out);
}

void decimal_groups_to_boundary(const CodepointText& t, size_t begin, size_t end,
                                std::vector<std::pair<size_t, size_t>>& out) {
  cut_runs_in_threes(t, begin, end, is_decimal, /*needs_boundary=*/true, out);
}

void split_before_decimal_triples(const CodepointText& t, size_t begin, size_t end,
                                  std::vector<std::pair<size_t, size_t>>& out) {
  // The lookahead holds where the decimal digits from there to the end of their run are a
  // positive multiple of three. One backward pass counts that run; the cuts come out from the
  // last, so the pieces are appended last first and then put in order.
  const size_t first_piece = out.size();
  size_t piece_end = end, digits_after = 0;
  for (size_t p = end; p-- > begin;) {
    digits_after = t.flags[p].is_decimal() ? digits_after + 1 : 0;
    if (p > begin && digits_after > 0 && digits_after % 3 == 0) {
      out.emplace_back(p, piece_end);
      piece_end = p;
    }
  }
  out.emplace_back(begin, piece_end);
  std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first_piece), out.end());
}

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

size_t chameleon_sentinel(const CodepointText& t, size_t pos, size_t end) {
  constexpr std::string_view prefix = "<sentinel:";
  if (pos + prefix.size() > end) return 0;
  for (size_t k = 0; k < prefix.size(); ++k) {
    if (t.cps[pos + k] != static_cast<uint8_t>(prefix[k])) return 0;
  }
  const size_t digits = run(t, pos + prefix.size(), end,
                            [](uint32_t c, unicode::CodepointFlags) { return c >= '0' && c <= '9'; });
  const size_t close = pos + prefix.size() + digits;
  return digits > 0 && close < end && t.cps[close] == '>' ? close + 1 - pos : 0;
}

size_t chameleon_image(const CodepointText& t, size_t pos, size_t end) {
  constexpr std::string_view prefix = "IMGIMG";
  if (pos + prefix.size() > end) return 0;
  for (size_t k = 0; k < prefix.size(); ++k) {
    if (t.cps[pos + k] != static_cast<uint8_t>(prefix[k])) return 0;
  }
  // (A|...|I){1,4} can give letters back, but a given-back letter is never the Z.
  const size_t letters = run(
      t, pos + prefix.size(), end, [](uint32_t c, unicode::CodepointFlags) { return c >= 'A' && c <= 'I'; },
      4);
  const size_t z = pos + prefix.size() + letters;
  return letters > 0 && z < end && t.cps[z] == 'Z' ? z + 1 - pos : 0;
}

size_t chameleon_whitespace(const CodepointText& t, size_t pos, size_t end) {
  if (t.cps[pos] == '\t' || t.cps[pos] == '\n') return 1;
  const size_t spaces = run(
      t, pos, end, [](uint32_t c, unicode::CodepointFlags) { return c == ' '; }, 4);
  return spaces == 4 ? 4 : spaces >= 2 ? 2 : 0;
}

size_t one_punctuation_or_ascii_symbol(const CodepointText& t, size_t pos, size_t end) {
  const uint32_t c = t.cps[pos];
  const bool ascii = (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
                     (c >= '{' && c <= '~');
  return ascii || t.flags[pos].is_punctuation() ? 1 : 0;
}

}  // namespace patterns
}  // namespace ember
