// tokenizer/byte_level.h: GPT-2's reversible map between bytes and printable code points, in
// which byte-level BPE vocabularies spell their tokens (a space is "Ġ", a newline "Ċ").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ember::byte_level {

// Printable Latin-1 bytes stand for themselves; the other 68 map to U+0100.. in byte order.
constexpr std::array<uint16_t, 256> make_byte_to_codepoint() {
  std::array<uint16_t, 256> map{};
  uint16_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<uint16_t>(b) : next++;
  }
  return map;
}

inline constexpr std::array<uint16_t, 256> k_byte_to_codepoint = make_byte_to_codepoint();
inline constexpr uint32_t k_max_codepoint = 256 + 68;  // every mapped code point is below this

constexpr std::array<int16_t, k_max_codepoint> make_codepoint_to_byte() {
  std::array<int16_t, k_max_codepoint> map{};
  for (auto& m : map) m = -1;
  for (int b = 0; b < 256; ++b) map[k_byte_to_codepoint[b]] = static_cast<int16_t>(b);
  return map;
}

inline constexpr std::array<int16_t, k_max_codepoint> k_codepoint_to_byte = make_codepoint_to_byte();

// The byte a code point stands for, -1 when it is not one of the 256 mapped code points.
inline int byte_of(uint32_t cp) { return cp < k_max_codepoint ? k_codepoint_to_byte[cp] : -1; }

// Appends the byte-level spelling of `bytes` (each byte becomes one code point, in UTF-8).
void encode(std::string_view bytes, std::string& out);

// Appends the bytes a byte-level spelling stands for; code points outside the map (tokens
// added by hand) are copied as their UTF-8.
void decode(std::string_view spelled, std::string& out);

}  // namespace ember::byte_level
