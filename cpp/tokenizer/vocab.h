// tokenizer/vocab.h: a tokenizer's vocabulary as stored in GGUF metadata (tokenizer.ggml.*):
// token texts, scores and types, the special token ids and the add-BOS/EOS/space-prefix flags.
// Knows nothing about how text is split into tokens (spm.cpp, bpe.cpp, wpm.cpp do that).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "tokenizer/flat_index.h"

namespace ember {

class GGUFFile;

// tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (byte-level BPE), "bert" (WordPiece).
enum class VocabKind { spm, bpe, wpm };

// tokenizer.ggml.token_type values.
enum class TokenType : uint8_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct TokenInfo {
  std::string text;    // as stored: SPM/WPM spell spaces "▁", BPE uses GPT-2's byte-to-unicode map
  float score = 0.0f;  // SPM merge priority (higher merges first)
  TokenType type = TokenType::normal;
  bool lstrip = false;  // when split out of text, swallow the whitespace before it
  bool rstrip = false;  // ... and after it
};

// Ids of the special tokens; -1 when the vocabulary has none.
struct SpecialTokenIds {
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, cls = -1, mask = -1;
};

class Vocab {
 public:
  // Reads tokenizer.ggml.*; throws FormatError naming the file and the key when the vocabulary
  // is missing or inconsistent, Unsupported for a tokenizer model this build does not have.
  static std::unique_ptr<const Vocab> from_gguf(const GGUFFile& file);

  VocabKind kind() const { return kind_; }
  const std::string& model_name() const { return model_; }  // tokenizer.ggml.model
  const std::string& pre_name() const { return pre_; }      // tokenizer.ggml.pre, "default" if absent
  const std::string& source() const { return source_; }     // the file it came from, for messages

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  bool contains(int32_t id) const { return id >= 0 && id < size(); }
  const TokenInfo& token(int32_t id) const { return tokens_[id]; }  // id must be valid
  // The id of the token spelled exactly `text`, -1 when none (the last one wins on duplicates).
  int32_t find(std::string_view text) const;

  const SpecialTokenIds& ids() const { return ids_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_sep() const { return add_sep_; }  // WordPiece: [SEP] closes every encoded text
  bool add_space_prefix() const { return add_space_prefix_; }
  // End-of-generation tokens: eos, eot, eom and the well-known end-of-turn texts.
  bool is_eog(int32_t id) const { return eog_.count(id) != 0; }
  const std::unordered_set<int32_t>& eog_ids() const { return eog_; }

  // Control, user-defined and unknown tokens, longest text first: the ones split out of raw
  // text before tokenizing it (control and unknown ones only when asked to).
  std::span<const int32_t> special_tokens() const { return special_tokens_; }

  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;

 private:
  Vocab() = default;
  void read_tokens(const GGUFFile& file);
  void read_special_ids(const GGUFFile& file);
  void find_end_of_generation();
  void set_strip_flags(const GGUFFile& file);
  void index_special_tokens();

  VocabKind kind_ = VocabKind::spm;
  std::string model_, pre_, source_;
  std::vector<TokenInfo> tokens_;
  struct TextOf {
    const std::vector<TokenInfo>* tokens;
    std::string_view operator()(int32_t id) const { return (*tokens)[id].text; }
  };
  // Reads the texts in tokens_, which never changes size after loading.
  TextIndex<TextOf> by_text_{TextOf{&tokens_}};
  SpecialTokenIds ids_;
  bool add_bos_ = false, add_eos_ = false, add_sep_ = false, add_space_prefix_ = false;
  std::unordered_set<int32_t> eog_;
  std::vector<int32_t> special_tokens_;
};

}  // namespace ember
