// tokenizer/tokenizer.h: text <-> token ids for a GGUF vocabulary. Owns the vocabulary and the
// algorithm its tokenizer.ggml.model names; adds BOS/EOS, cuts out special tokens and renders
// tokens back to bytes. Immutable after loading, so one instance serves many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/encoder.h"
#include "tokenizer/vocab.h"

namespace ember {

class GGUFFile;

class Tokenizer {
 public:
  // Builds the tokenizer described by a GGUF's tokenizer.ggml.* metadata (a full model or a
  // vocabulary-only file). Throws FormatError (no or broken vocabulary) or Unsupported.
  static std::shared_ptr<const Tokenizer> from_gguf(const GGUFFile& file);
  static std::shared_ptr<const Tokenizer> open(const std::string& path);

  // add_special: BOS/EOS (or [CLS]/[SEP]) as the vocabulary asks for them.
  // parse_special: control tokens spelled out in the text ("<|im_start|>") become those
  // tokens; otherwise they are tokenized as plain text. User-defined tokens always are.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The text of `ids`, as well-formed UTF-8 (broken sequences become U+FFFD). With
  // skip_special, control and unknown tokens render as nothing; otherwise as their text.
  // The space a SentencePiece or WordPiece vocabulary puts before the first word is removed,
  // so decode(encode(text)) == text for lossless vocabularies. Throws InvalidArgument for an id
  // outside [0, n_vocab).
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;

  // The bytes token `id` stands for (possibly part of a UTF-8 sequence). Control and unknown
  // tokens give "" unless render_special. Throws InvalidArgument for an invalid id.
  std::string_view piece(int32_t id, bool render_special) const;

  const Vocab& vocab() const { return *vocab_; }
  int32_t n_vocab() const { return vocab_->size(); }
  int32_t bos() const { return vocab_->ids().bos; }
  int32_t eos() const { return vocab_->ids().eos; }
  int32_t eot() const { return vocab_->ids().eot; }
  // Whether `id` ends generation (EOS, end of turn, ...); false for ids outside the vocabulary.
  bool is_eog(int64_t id) const {
    return id >= 0 && id < n_vocab() && vocab_->is_eog(static_cast<int32_t>(id));
  }
  bool is_special(int32_t id) const;  // control or unknown: hidden by skip_special

  // Throws InvalidArgument unless 0 <= id < n_vocab (wide, so callers can check before narrowing).
  void check_id(int64_t id) const;

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

 private:
  Tokenizer() = default;
  void render_pieces();

  std::unique_ptr<const Vocab> vocab_;
  std::unique_ptr<Encoder> encoder_;
  std::vector<std::string> pieces_;  // [n_vocab]: the bytes each token stands for
  bool strip_first_space_ = false;   // decode drops the space the encoder put before the text
};

}  // namespace ember
