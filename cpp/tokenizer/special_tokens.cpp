// tokenizer/special_tokens.cpp: special-token partitioning. For each candidate token (longest
// first), every remaining text fragment is searched and split around its occurrences, the
// same order of decisions as llama.cpp's tokenizer_st_partition, so overlapping candidates
// resolve the same way. Cost: O(text length) per candidate token.
#include "tokenizer/special_tokens.h"

#include "tokenizer/vocab.h"

namespace ember {

namespace {

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

std::vector<Fragment> split_special_tokens(const Vocab& vocab, std::string_view text, bool parse_special) {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t id : vocab.special_tokens()) {
    const TokenInfo& token = vocab.token(id);
    const bool always = token.type == TokenType::user_defined;
    if (!always && !parse_special) continue;
    const std::string_view needle = token.text;
    // Cheap rejection: most candidates occur nowhere in the text.
    if (text.find(needle) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.begin;
      while (begin < f.end) {
        const size_t match = text.substr(0, f.end).find(needle, begin);
        if (match == std::string_view::npos) break;
        size_t left_end = match;
        if (token.lstrip) {
          while (left_end > begin && is_ascii_space(text[left_end - 1])) --left_end;
        }
        if (left_end > begin) next.push_back({-1, begin, left_end});
        next.push_back({id, 0, 0});
        begin = match + needle.size();
        if (token.rstrip) {
          while (begin < f.end && is_ascii_space(text[begin])) ++begin;
        }
      }
      if (begin < f.end) next.push_back({-1, begin, f.end});
    }
    std::swap(fragments, next);
  }
  return fragments;
}

}  // namespace ember
