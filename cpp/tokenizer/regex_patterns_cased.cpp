// tokenizer/regex_patterns_cased.cpp: the case-aware regexes of o200k (GPT-4o, Llama 4), Tekken,
// Tiny Aya, Youtu and Kimi K2, which cut "HelloWorld" into "Hello" and "World":
//   [^\r\n\p{L}\p{N}]?UPPER*LOWER+CONTRACTION?|[^\r\n\p{L}\p{N}]?UPPER+LOWER*CONTRACTION?|
//   \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+TAIL|\s*[\r\n]+|\s+(?!\S)|\s+
// with UPPER = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and LOWER = [\p{Ll}\p{Lm}\p{Lo}\p{M}] (modifier and
// other letters and marks are in both). llama.cpp runs these through std::regex over a text where
// every non-ASCII letter counts as both cases and marks as neither; this follows the regexes.
#include <array>

#include "tokenizer/regex_match.h"
#include "tokenizer/regex_patterns.h"

namespace ember::patterns {

namespace {

using namespace match;

struct CasedOptions {
  bool contractions = true;  // (?i:'s|'t|'re|'ve|'m|'ll|'d)? closes a word
  size_t max_digits = 3;
  Tail tail = Tail::line_breaks_or_slashes;
  bool han_apart = false;  // Kimi K2: [\p{Han}]+ comes first, and Han is left out of UPPER and LOWER
};

// \p{Han}: the code points of Script=Han, as the Oniguruma of Hugging Face tokenizers 0.23 has
// them (ideographs, their extensions and compatibility forms, radicals, 々 〇 〡..〩 〸..〻).
// llama.cpp's Kimi K2 splitter uses the ideograph blocks alone.
constexpr std::array<Range, 22> k_han{{
    {0x2E80, 0x2E99},   {0x2E9B, 0x2EF3},   {0x2F00, 0x2FD5},   {0x3005, 0x3005},   {0x3007, 0x3007},
    {0x3021, 0x3029},   {0x3038, 0x303B},   {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFA6D},
    {0xFA70, 0xFAD9},   {0x16FE2, 0x16FE3}, {0x16FF0, 0x16FF1}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B739},
    {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D},
    {0x30000, 0x3134A}, {0x31350, 0x323AF},
}};

bool is_han(uint32_t c) { return c >= 0x2E80 && in_ranges(k_han, c); }

template <bool han_apart>
bool is_upper_class(uint32_t c, unicode::CodepointFlags f) {
  return ((f.is_letter() && !f.is_lower()) || f.is_mark()) && !(han_apart && is_han(c));
}

template <bool han_apart>
bool is_lower_class(uint32_t c, unicode::CodepointFlags f) {
  return ((f.is_letter() && !f.is_upper()) || f.is_mark()) && !(han_apart && is_han(c));
}

constexpr size_t k_no_match = SIZE_MAX;

// Where UPPER*LOWER+ starting at `start` ends, or k_no_match. UPPER* is greedy: it takes the
// whole UPPER run, then gives back code points until LOWER+ can start; only a code point in
// both classes (or the one after the run) can start it.
template <bool han_apart>
size_t upper_then_lower(const CodepointText& t, size_t start, size_t end) {
  const size_t upper_end = start + run(t, start, end, is_upper_class<han_apart>);
  if (in_class(t, upper_end, end, is_lower_class<han_apart>)) {
    return upper_end + run(t, upper_end, end, is_lower_class<han_apart>);
  }
  for (size_t k = upper_end; k > start; --k) {
    if (is_lower_class<han_apart>(t.cps[k - 1], t.flags[k - 1])) return k;  // the next is not LOWER
  }
  return k_no_match;
}

// Where UPPER+LOWER* starting at `start` ends, or k_no_match.
template <bool han_apart>
size_t upper_then_optional_lower(const CodepointText& t, size_t start, size_t end) {
  const size_t upper_end = start + run(t, start, end, is_upper_class<han_apart>);
  if (upper_end == start) return k_no_match;
  return upper_end + run(t, upper_end, end, is_lower_class<han_apart>);
}

template <bool han_apart>
size_t cased(const CodepointText& t, size_t pos, size_t end, const CasedOptions& o) {
  const uint32_t c = t.cps[pos];
  const unicode::CodepointFlags f = t.flags[pos];
  if (han_apart && is_han(c)) return range_run(t, pos, end, k_han);
  // Each word alternative tries the optional leading character first, then goes without it.
  const bool may_lead = c != '\r' && c != '\n' && !f.is_letter() && !f.is_number();
  size_t word_end = k_no_match;
  if (may_lead) word_end = upper_then_lower<han_apart>(t, pos + 1, end);
  if (word_end == k_no_match) word_end = upper_then_lower<han_apart>(t, pos, end);
  if (word_end == k_no_match && may_lead) word_end = upper_then_optional_lower<han_apart>(t, pos + 1, end);
  if (word_end == k_no_match) word_end = upper_then_optional_lower<han_apart>(t, pos, end);
  if (word_end != k_no_match) {
    if (o.contractions) word_end += contraction(t, word_end, end, /*ignore_case=*/true);
    return word_end - pos;
  }
  if (f.is_number()) return run(t, pos, end, is_number, o.max_digits);
  if (size_t n = symbols_then_tail(t, pos, end, is_other, o.tail)) return n;
  return line_breaks_or_whitespace(t, pos, end);
}

constexpr CasedOptions k_gpt4o{};
constexpr CasedOptions k_tekken{.contractions = false, .max_digits = 1};
constexpr CasedOptions k_youtu{.max_digits = 1};
constexpr CasedOptions k_kimi_k2{.tail = Tail::line_breaks, .han_apart = true};

}  // namespace

size_t gpt4o(const CodepointText& t, size_t pos, size_t end) { return cased<false>(t, pos, end, k_gpt4o); }
size_t tekken(const CodepointText& t, size_t pos, size_t end) { return cased<false>(t, pos, end, k_tekken); }
size_t youtu(const CodepointText& t, size_t pos, size_t end) { return cased<false>(t, pos, end, k_youtu); }
size_t kimi_k2(const CodepointText& t, size_t pos, size_t end) { return cased<true>(t, pos, end, k_kimi_k2); }

}  // namespace ember::patterns
