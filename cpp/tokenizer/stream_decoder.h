// tokenizer/stream_decoder.h: turns generated token ids, one at a time, into text that is
// always whole UTF-8 — a character split across byte tokens is held back until complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace ember {

class StreamDecoder {
 public:
  // skip_special: control tokens (BOS, end-of-turn, ...) add no text.
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special = true);

  // Appends token `id` and returns the text that became complete (often "", e.g. after the
  // first byte of an emoji). No space is stripped: the tokens continue earlier text.
  // Throws InvalidArgument for an invalid id.
  std::string push(int32_t id);

  // Returns what is held back, ill-formed or truncated sequences replaced by U+FFFD, and
  // starts over.
  std::string flush();

  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence (at most 3)
};

}  // namespace ember
