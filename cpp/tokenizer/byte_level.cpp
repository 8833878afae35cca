// tokenizer/byte_level.cpp: converts text to and from GPT-2's byte-level spelling.
#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace ember::byte_level {

void encode(std::string_view bytes, std::string& out) {
  for (char c : bytes) utf8::append(k_byte_to_codepoint[static_cast<uint8_t>(c)], out);
}

void decode(std::string_view spelled, std::string& out) {
  for (size_t pos = 0; pos < spelled.size();) {
    const utf8::Decoded d = utf8::decode(spelled, pos);
    const int b = d.valid ? byte_of(d.cp) : -1;
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(spelled.data() + pos, d.n_bytes);
    }
    pos += d.n_bytes;
  }
}

}  // namespace ember::byte_level
