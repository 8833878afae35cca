// tokenizer/regex_patterns.h: the pre-tokenizer regexes of BPE vocabularies, each written by
// hand as a matcher over code points and their Unicode flags (std::regex has no \p{L}).
// A matcher answers one question: how long is the match that starts exactly here?
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace ember {

// A text decoded once: code points, their flags and where each starts in the UTF-8 bytes.
// Ill-formed bytes decode as U+FFFD but keep their own byte span, so words cut from byte
// offsets reproduce the input exactly.
struct CodepointText {
  std::vector<uint32_t> cps;
  std::vector<unicode::CodepointFlags> flags;
  std::vector<size_t> offsets;  // [cps.size() + 1]: byte offset of each code point, then the end

  void assign(std::string_view text);
  size_t size() const { return cps.size(); }
};

// The length in code points of the regex's match starting at `pos` (0: no match there).
// [pos, end) is the segment being split: lookaheads see `end` as the end of the text, as
// regexes do when run over each segment separately.
using MatchFn = size_t (*)(const CodepointText& text, size_t pos, size_t end);

// A regex that matches only empty strings (a lookahead) splits where it matches instead:
// appends the pieces of [begin, end) to `out`, as code point ranges that cover it in order.
using SplitFn = void (*)(const CodepointText& text, size_t begin, size_t end,
                         std::vector<std::pair<size_t, size_t>>& out);

// One pre-tokenizer pass: a matcher (matches and the gaps between them become pieces) or a
// zero-width splitter.
struct Pass {
  MatchFn match = nullptr;
  SplitFn split = nullptr;
  constexpr Pass(MatchFn m) : match(m) {}  // NOLINT(google-explicit-constructor): table rows list passes
  constexpr Pass(SplitFn s) : split(s) {}  // NOLINT(google-explicit-constructor)
};

namespace patterns {

// The GPT-2 and Llama 3 families (regex_patterns.cpp).
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+   (GPT-2)
size_t gpt2(const CodepointText& t, size_t pos, size_t end);
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3)
size_t llama3(const CodepointText& t, size_t pos, size_t end);
// The Llama 3 regex with \p{N} instead of \p{N}{1,3}   (Qwen2)
size_t qwen2(const CodepointText& t, size_t pos, size_t end);
// Qwen2's with [\p{L}\p{M}]+ words and [^\s\p{L}\p{M}\p{N}] symbols   (Qwen3.5)
size_t qwen35(const CodepointText& t, size_t pos, size_t end);
// Qwen2's without the contractions   (UfakZeka: Turkish suffixes after an apostrophe stay on)
size_t ufakzeka(const CodepointText& t, size_t pos, size_t end);
// Qwen2's with " ?[^\s\p{L}\p{N}\r\n]+" (no line breaks after symbols)   (Seed-Coder)
size_t seed_coder(const CodepointText& t, size_t pos, size_t end);
// The Llama 3 regex with \p{N}+   (MiniCPM 5, after numbers_up_to_3)
size_t minicpm5(const CodepointText& t, size_t pos, size_t end);
// The Llama 3 regex with \s{512}(?!\S)|\s{256}(?!\S)|...|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}
// for its whitespace   (JAIS 2)
size_t jais2(const CodepointText& t, size_t pos, size_t end);
// (?i:'s|...)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|
// \s*[\r\n]|\s+(?!\S)|\s+   (EXAONE MoE: words with single spaces inside)
size_t exaone_moe(const CodepointText& t, size_t pos, size_t end);

// The case-aware family (regex_patterns_cased.cpp): see that file for the shared shape.
// o200k: contractions, \p{N}{1,3}, " ?[^\s\p{L}\p{N}]+[\r\n/]*"   (GPT-4o, Llama 4, Tiny Aya)
size_t gpt4o(const CodepointText& t, size_t pos, size_t end);
// no contractions, \p{N}   (Mistral Tekken)
size_t tekken(const CodepointText& t, size_t pos, size_t end);
// contractions, \p{N}   (Youtu, after youtu_scripts)
size_t youtu(const CodepointText& t, size_t pos, size_t end);
// [\p{Han}]+ first, Han outside the word classes, " ?[^\s\p{L}\p{N}]+[\r\n]*"   (Kimi K2)
size_t kimi_k2(const CodepointText& t, size_t pos, size_t end);

// Code point range classes (regex_patterns_cjk.cpp).
// \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+ (DeepSeek LLM's cased letters of many scripts)
size_t deepseek_llm_letters(const CodepointText& t, size_t pos, size_t end);
// \s?[!-/:-~！-／：-～‘-‟　-。]+
size_t deepseek_llm_punctuation(const CodepointText& t, size_t pos, size_t end);
// [一-龥぀-ゟ゠-ヿ]+
size_t cjk_kana_run(const CodepointText& t, size_t pos, size_t end);
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (DeepSeek V3, Hunyuan dense, AFMoE)
size_t deepseek3(const CodepointText& t, size_t pos, size_t end);
// DeepSeek V3's with " ?[\p{P}\p{S}]+|[\r\n]" for its last alternatives but whitespace   (Spark)
size_t spark2_5(const CodepointText& t, size_t pos, size_t end);
// [一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+
// (AFMoE)
size_t afmoe_scripts(const CodepointText& t, size_t pos, size_t end);
// [가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+
// (Youtu)
size_t youtu_scripts(const CodepointText& t, size_t pos, size_t end);

// Short single-purpose regexes (regex_patterns.cpp).
// [\r\n]
size_t newline(const CodepointText& t, size_t pos, size_t end);
// [^\n]+|[\n]+
size_t newline_runs(const CodepointText& t, size_t pos, size_t end);
// \S+   (the "whitespace" pre-tokenizer: words are what lies between whitespace)
size_t non_whitespace_run(const CodepointText& t, size_t pos, size_t end);
// \s?\p{L}+
size_t space_letters(const CodepointText& t, size_t pos, size_t end);
// \s?\p{P}+
size_t space_punctuation(const CodepointText& t, size_t pos, size_t end);
// \s+$
size_t trailing_whitespace(const CodepointText& t, size_t pos, size_t end);
// [一-龥ࠀ-一가-퟿]+  (U+0800..U+9FA5 and U+AC00..U+D7FF)
size_t cjk_run(const CodepointText& t, size_t pos, size_t end);
// \p{N}
size_t one_number(const CodepointText& t, size_t pos, size_t end);
// \p{N}+
size_t numbers(const CodepointText& t, size_t pos, size_t end);
// \p{N}{1,3}
size_t numbers_up_to_3(const CodepointText& t, size_t pos, size_t end);
// A run of numbers in groups of three from the right: "1234567" -> "1", "234", "567"
// (llama.cpp's \p{AFMoE_digits})
void digit_groups(const CodepointText& t, size_t begin, size_t end,
                  std::vector<std::pair<size_t, size_t>>& out);
// \d{1,3}(?=(?:\d{3})*\b): the same groups of decimal digits, only for a run that ends at a word
// boundary   (Tiny Aya)
void decimal_groups_to_boundary(const CodepointText& t, size_t begin, size_t end,
                                std::vector<std::pair<size_t, size_t>>& out);
// (?=(\d{3})+(?!\d)): splits before every three decimal digits that end a run   (SuperBPE)
void split_before_decimal_triples(const CodepointText& t, size_t begin, size_t end,
                                  std::vector<std::pair<size_t, size_t>>& out);
// [0-9][0-9][0-9]
size_t three_ascii_digits(const CodepointText& t, size_t pos, size_t end);
// [\p{P}\$\+<=>\^~\|]+
size_t punctuation_run(const CodepointText& t, size_t pos, size_t end);
// [\p{P}\$\+<=>\^~\|`]+   (Falcon)
size_t punctuation_run_falcon(const CodepointText& t, size_t pos, size_t end);
//  ?[^(\s|.,!?…。，、।۔،)]+   (BLOOM)
size_t bloom(const CodepointText& t, size_t pos, size_t end);
// <sentinel:[0-9]+>   (Chameleon)
size_t chameleon_sentinel(const CodepointText& t, size_t pos, size_t end);
// (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z   (Chameleon)
size_t chameleon_image(const CodepointText& t, size_t pos, size_t end);
// ([\t\n]|    |  )   (Chameleon)
size_t chameleon_whitespace(const CodepointText& t, size_t pos, size_t end);
// [\p{P}!-/:-@\[-`{-~]   (Chameleon: one punctuation mark or ASCII symbol)
size_t one_punctuation_or_ascii_symbol(const CodepointText& t, size_t pos, size_t end);

}  // namespace patterns
}  // namespace ember
