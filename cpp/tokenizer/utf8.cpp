// tokenizer/utf8.cpp: UTF-8 decoding with U+FFFD replacement; see utf8.h for the policy.
#include "tokenizer/utf8.h"

namespace ember::utf8 {

namespace {

// Length of the sequence a lead byte announces, and the allowed range of its first
// continuation byte (narrower than 80..BF after E0, ED, F0 and F4, which excludes overlong
// forms, surrogates and code points past U+10FFFF). n == 0: not a lead byte.
struct LeadInfo {
  uint32_t n;
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes of s[pos..] that are a well-formed prefix of the sequence starting there
// (the lead byte included), and whether that prefix is the whole sequence.
struct Scan {
  uint32_t n_ok;
  bool complete;
};

Scan scan(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const LeadInfo info = lead_info(b0);
  if (info.n == 0) return {0, false};
  if (info.n == 1) return {1, true};
  uint32_t k = 1;
  for (; k < info.n; ++k) {
    if (pos + k >= s.size()) return {k, false};
    const auto b = static_cast<uint8_t>(s[pos + k]);
    const uint8_t lo = k == 1 ? info.second_lo : 0x80;
    const uint8_t hi = k == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return {k, false};
  }
  return {k, true};
}

uint32_t assemble(std::string_view s, size_t pos, uint32_t n) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (n == 1) return b0;
  uint32_t cp = b0 & (0x7F >> n);
  for (uint32_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + k]) & 0x3F);
  return cp;
}

}  // namespace

Decoded decode(std::string_view s, size_t pos) {
  const Scan sc = scan(s, pos);
  if (sc.complete) return {assemble(s, pos, sc.n_ok), sc.n_ok, true};
  return {k_replacement, sc.n_ok == 0 ? 1u : sc.n_ok, false};
}

size_t truncated_sequence_bytes(std::string_view s, size_t pos) {
  const Scan sc = scan(s, pos);
  if (sc.complete || sc.n_ok == 0 || pos + sc.n_ok < s.size()) return 0;
  return sc.n_ok;  // every byte up to the end of the input fits: more may follow
}

void append(uint32_t cp, std::string& out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = k_replacement;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t append_replacing_invalid(std::string_view bytes, std::string& out, bool final) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[pos]);
    if (b < 0x80) {  // the common case, byte by byte
      out += static_cast<char>(b);
      ++pos;
      continue;
    }
    if (!final && truncated_sequence_bytes(bytes, pos) > 0) break;
    const Decoded d = decode(bytes, pos);
    if (d.valid) {
      out.append(bytes.data() + pos, d.n_bytes);
    } else {
      append(k_replacement, out);
    }
    pos += d.n_bytes;
  }
  return pos;
}

}  // namespace ember::utf8
