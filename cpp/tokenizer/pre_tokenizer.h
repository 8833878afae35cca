// tokenizer/pre_tokenizer.h: splits text into words before BPE, the way the
// tokenizer named by tokenizer.ggml.pre does (a list of regexes applied one after another, each
// splitting every piece into its matches and the gaps between them, as llama.cpp does).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/regex_patterns.h"

namespace ember {

// What a tokenizer.ggml.pre name stands for.
struct PreTokenizerSpec {
  std::vector<Pass> passes;    // regexes, applied in order
  bool ignore_merges = false;  // a word that is itself a token is not merged (Llama 3)
  bool adds_bos = false;       // BOS is added by default when the file does not say
  bool adds_sep = false;       // ... and so is SEP after the text (BERT-like encoders)
  bool forces_bos = false;     // BOS is added even where the file says not (llama.cpp's Gemma 4 override)
  // SentencePiece-style BPE: tokens spell raw UTF-8 (not GPT-2's byte map), merging starts from
  // characters, and a character no token spells becomes its <0xXX> byte tokens.
  bool raw_utf8 = false;
  bool escape_spaces = false;       // spaces are spelled "▁" before splitting (and back in decoding)
  bool whole_newline_runs = false;  // a word of newlines that is a token stays whole (Gemma 4)
  bool drops_whitespace = false;    // the whitespace between words becomes no token ("whitespace")
};

// The spec for a tokenizer.ggml.pre value; nullopt when unknown.
std::optional<PreTokenizerSpec> find_pre_tokenizer(std::string_view name);

// The tokenizer.ggml.pre values find_pre_tokenizer knows, in table order.
std::vector<std::string_view> pre_tokenizer_names();
// The same, comma-separated (for messages).
std::string known_pre_tokenizers();

// The words the pre-tokenizer `name` splits `text` into (what BPE then encodes one by one).
// Throws Unsupported, naming the known ones, when `name` is unknown.
std::vector<std::string> pre_tokenize(std::string_view name, std::string_view text);

class PreTokenizer {
 public:
  explicit PreTokenizer(std::vector<Pass> passes) : passes_(std::move(passes)) {}

  // Appends the words of `text` to `words` as [begin, end) byte ranges; together they cover
  // the text exactly, in order. `scratch` is reused between calls to avoid allocations.
  struct Scratch {
    CodepointText text;
    std::vector<std::pair<size_t, size_t>> segments, next;  // code point ranges
  };
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words, Scratch& scratch) const;

 private:
  std::vector<Pass> passes_;
};

}  // namespace ember
