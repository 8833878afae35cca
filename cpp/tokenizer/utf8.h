// tokenizer/utf8.h: UTF-8 decoding and encoding for the tokenizers. Invalid input never throws:
// it decodes as U+FFFD, replacing each maximal ill-formed subpart once (the Unicode/WHATWG
// policy, the same one Python's bytes.decode(errors="replace") follows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ember::utf8 {

constexpr uint32_t k_replacement = 0xFFFD;

// One decoded code point: `cp` spans `n_bytes` bytes of the input. `valid` is false when those
// bytes are an ill-formed (or, at the end of the input, truncated) sequence and cp is U+FFFD.
struct Decoded {
  uint32_t cp;
  uint32_t n_bytes;
  bool valid;
};

// Decodes the code point that starts at s[pos] (pos < s.size()).
Decoded decode(std::string_view s, size_t pos);

// How many bytes of s[pos..] form the start of a well-formed sequence that the end of the
// input cut short (0 when s[pos..] is complete or ill-formed regardless of what follows).
size_t truncated_sequence_bytes(std::string_view s, size_t pos);

// Appends the UTF-8 encoding of cp (cp <= 0x10FFFF; surrogates are encoded as U+FFFD).
void append(uint32_t cp, std::string& out);

// Appends `bytes` to `out` as well-formed UTF-8, each ill-formed subpart replaced by U+FFFD.
// With final == false a well-formed but truncated sequence at the end is not consumed; the
// return value is the number of bytes consumed (bytes.size() when final).
size_t append_replacing_invalid(std::string_view bytes, std::string& out, bool final);

}  // namespace ember::utf8
