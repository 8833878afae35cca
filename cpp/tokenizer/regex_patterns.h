// tokenizer/regex_patterns.h: the pre-tokenizer regexes of BPE vocabularies, each written by
// hand as a matcher over code points and their Unicode flags (std::regex has no \p{L}).
// A matcher answers one question: how long is the match that starts exactly here?
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
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

namespace patterns {

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+   (GPT-2)
size_t gpt2(const CodepointText& t, size_t pos, size_t end);
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3)
size_t llama3(const CodepointText& t, size_t pos, size_t end);
// The Llama 3 regex with \p{N} instead of \p{N}{1,3}   (Qwen2)
size_t qwen2(const CodepointText& t, size_t pos, size_t end);
// [\r\n]
size_t newline(const CodepointText& t, size_t pos, size_t end);
// \s?\p{L}+
size_t space_letters(const CodepointText& t, size_t pos, size_t end);
// \s?\p{P}+
size_t space_punctuation(const CodepointText& t, size_t pos, size_t end);
// [一-龥ࠀ-一가-퟿]+  (U+0800..U+9FA5 and U+AC00..U+D7FF)
size_t cjk_run(const CodepointText& t, size_t pos, size_t end);
// \p{N}
size_t one_number(const CodepointText& t, size_t pos, size_t end);
// \p{N}+
size_t numbers(const CodepointText& t, size_t pos, size_t end);
// [0-9][0-9][0-9]
size_t three_ascii_digits(const CodepointText& t, size_t pos, size_t end);
// [\p{P}\$\+<=>\^~\|]+
size_t punctuation_run(const CodepointText& t, size_t pos, size_t end);
// [\p{P}\$\+<=>\^~\|`]+   (Falcon)
size_t punctuation_run_falcon(const CodepointText& t, size_t pos, size_t end);
//  ?[^(\s|.,!?…。，、।۔،)]+   (BLOOM)
size_t bloom(const CodepointText& t, size_t pos, size_t end);

}  // namespace patterns
}  // namespace ember
