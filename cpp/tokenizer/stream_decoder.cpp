// tokenizer/stream_decoder.cpp: incremental UTF-8 assembly over token pieces.
#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace ember {

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  pending_.append(tokenizer_->piece(id, !skip_special_));
  std::string out;
  // Everything but a truncated sequence at the end goes out now; ill-formed bytes cannot be
  // completed by later tokens, so they become U+FFFD right away.
  const size_t used = utf8::append_replacing_invalid(pending_, out, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_replacing_invalid(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace ember
