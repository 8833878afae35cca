// tokenizer/pre_tokenizer.cpp: the table from tokenizer.ggml.pre names to regex lists (the same
// grouping as llama.cpp's llama-vocab.cpp) and the splitting loop that applies them.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <initializer_list>

namespace ember {

namespace {

namespace p = patterns;

struct NamedSpec {
  std::initializer_list<std::string_view> names;
  std::initializer_list<MatchFn> passes;
  bool ignore_merges;
  bool adds_bos;
};

// Names sharing a row use the same regexes. The comments give llama.cpp's group names.
const NamedSpec k_specs[] = {
    // LLAMA3: Llama 3 and its descendants keep whole-word tokens and open with BOS.
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"}, {p::llama3}, true, true},
    // DBRX, SMAUG: the Llama 3 regex alone.
    {{"dbrx", "smaug-bpe"}, {p::llama3}, false, false},
    // QWEN2, STABLELM2: the Llama 3 regex with single digits.
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez"}, {p::qwen2}, false, false},
    // GPT2 and friends: the GPT-2 regex.
    {{"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
      "mpt", "olmo", "jais", "trillion"},
     {p::gpt2},
     false,
     false},
    // STARCODER and friends: digits one by one, then the GPT-2 regex.
    {{"starcoder", "refact", "jina-v2-code", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
     {p::one_number, p::gpt2},
     false,
     false},
    // DEEPSEEK_CODER
    {{"deepseek-coder"},
     {p::newline, p::space_letters, p::space_punctuation, p::cjk_run, p::one_number},
     false,
     false},
    // FALCON
    {{"falcon"}, {p::punctuation_run_falcon, p::gpt2, p::three_ascii_digits}, false, false},
    // BLOOM, PORO, GPT3-FINNISH
    {{"bloom", "poro-chat", "gpt3-finnish"}, {p::bloom}, false, false},
    // DEFAULT: what llama.cpp uses when a BPE file names no pre-tokenizer.
    {{"default"}, {p::punctuation_run, p::gpt2, p::numbers, p::three_ascii_digits}, false, false},
};

}  // namespace

std::optional<PreTokenizerSpec> find_pre_tokenizer(std::string_view name) {
  for (const NamedSpec& s : k_specs) {
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) {
      return PreTokenizerSpec{std::vector<MatchFn>(s.passes), s.ignore_merges, s.adds_bos};
    }
  }
  return std::nullopt;
}

std::string known_pre_tokenizers() {
  std::string out;
  for (const NamedSpec& s : k_specs) {
    for (std::string_view name : s.names) {
      if (!out.empty()) out += ", ";
      out += name;
    }
  }
  return out;
}

void PreTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words,
                         Scratch& scratch) const {
  CodepointText& t = scratch.text;
  t.assign(text);
  auto& segments = scratch.segments;
  auto& next = scratch.next;
  segments.assign(1, {0, t.size()});
  for (MatchFn match : passes_) {
    next.clear();
    for (const auto& [begin, end] : segments) {
      // A regex search over [begin, end): matches become pieces, and so do the gaps between
      // them (the gaps are split further by the next regex, or become words as they are).
      size_t gap = begin;
      for (size_t pos = begin; pos < end;) {
        const size_t n = match(t, pos, end);
        if (n == 0) {
          ++pos;
          continue;
        }
        if (gap < pos) next.emplace_back(gap, pos);
        next.emplace_back(pos, pos + n);
        pos += n;
        gap = pos;
      }
      if (gap < end) next.emplace_back(gap, end);
    }
    std::swap(segments, next);
  }
  for (const auto& [begin, end] : segments) words.emplace_back(t.offsets[begin], t.offsets[end]);
}

}  // namespace ember
