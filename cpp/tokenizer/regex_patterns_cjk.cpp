// tokenizer/regex_patterns_cjk.cpp: the regexes of the tokenizers that treat CJK and other
// scripts by code point ranges (DeepSeek LLM and V3, Hunyuan, Spark, AFMoE, Youtu). The ranges
// are the character classes of their tokenizer.json files, written out.
#include <array>

#include "tokenizer/regex_match.h"
#include "tokenizer/regex_patterns.h"

namespace ember::patterns {

namespace {

using namespace match;

// DeepSeek LLM's letter class: the cased letters of Latin, Greek, Cyrillic, Armenian, Georgian,
// Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi and Adlam.
constexpr std::array<Range, 87> k_deepseek_letters{{
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},   {0x00D8, 0x00F6},
    {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},   {0x0295, 0x02AF},   {0x0370, 0x0373},
    {0x0376, 0x0376},   {0x0377, 0x0377},   {0x037B, 0x037D},   {0x037F, 0x037F},   {0x0386, 0x0386},
    {0x0388, 0x038A},   {0x038C, 0x038C},   {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},
    {0x048A, 0x052F},   {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},
    {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},
    {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FBC},   {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},
    {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},
    {0x2126, 0x2126},   {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},
    {0x213C, 0x213F},   {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2183},   {0x2184, 0x2184},
    {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF2},   {0x2CF3, 0x2CF3},
    {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},
    {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2},
    {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
}};

// [!-/:-~！-／：-～‘-‟　-。]
constexpr std::array<Range, 6> k_deepseek_punctuation{{
    {0x0021, 0x002F},
    {0x003A, 0x007E},
    {0x2018, 0x201F},
    {0x3000, 0x3002},
    {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E},
}};

// [一-龥぀-ゟ゠-ヿ]: CJK ideographs to U+9FA5, hiragana, katakana
constexpr std::array<Range, 3> k_cjk_kana{{{0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5}}};

// AFMoE's class of CJK and Southeast Asian scripts: CJK ideographs and extension A,
// compatibility ideographs, kana and halfwidth kana, Kangxi radicals, Thai (from U+0E40), Lao,
// Khmer, Myanmar and its extensions, Hangul syllables and jamo. The compatibility ideographs
// start at U+F900; llama.cpp's copy of the class has the NFC-normalised U+8C48 there instead,
// which stretches the range over U+A000..U+F8FF.
constexpr std::array<Range, 15> k_afmoe_scripts{{
    {0x0E40, 0x0E7F},
    {0x0E80, 0x0EFF},
    {0x1000, 0x109F},
    {0x1100, 0x11FF},
    {0x1780, 0x17FF},
    {0x2F00, 0x2FDF},
    {0x3040, 0x309F},
    {0x30A0, 0x30FF},
    {0x3400, 0x4DBF},
    {0x4E00, 0x9FFF},
    {0xA9E0, 0xA9FF},
    {0xAA60, 0xAA7F},
    {0xAC00, 0xD7AF},
    {0xF900, 0xFAFF},
    {0xFF65, 0xFF9F},
}};

// Youtu's first regex, four classes:
// [가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+
constexpr std::array<Range, 2> k_youtu_hangul{{{0x3131, 0x318E}, {0xAC00, 0xD7A3}}};
constexpr std::array<Range, 10> k_youtu_punctuation{{
    {0x2014, 0x2014},
    {0x2018, 0x2019},
    {0x201C, 0x201D},
    {0x2026, 0x2026},
    {0x3001, 0x303F},
    {0xFE30, 0xFE4F},
    {0xFF01, 0xFF01},
    {0xFF0C, 0xFF0C},
    {0xFF1A, 0xFF1A},
    {0xFF1B, 0xFF1B},
}};
constexpr std::array<Range, 1> k_youtu_bopomofo{{{0x3105, 0x312F}}};

// \s?[...]+ for a class of ranges: the optional leading character is any whitespace.
size_t optional_whitespace_then_ranges(const CodepointText& t, size_t pos, size_t end,
                                       std::span<const Range> r) {
  if (t.flags[pos].is_whitespace() && pos + 1 < end && in_ranges(r, t.cps[pos + 1])) {
    return 1 + range_run(t, pos + 1, end, r);
  }
  return range_run(t, pos, end, r);
}

bool is_ascii_punctuation(uint32_t c, unicode::CodepointFlags) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
bool is_punct_or_symbol(uint32_t, unicode::CodepointFlags f) { return f.is_punctuation() || f.is_symbol(); }

// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+TAIL|  then the whitespace alternatives (DeepSeek V3, and Spark without TAIL)
size_t deepseek3_like(const CodepointText& t, size_t pos, size_t end, bool spark) {
  const uint32_t c = t.cps[pos];
  const unicode::CodepointFlags f = t.flags[pos];
  if (is_ascii_punctuation(c, f) && in_class(t, pos + 1, end, is_ascii_letter)) {
    return 1 + run(t, pos + 1, end, is_ascii_letter);
  }
  const bool may_lead = c != '\r' && c != '\n' && !f.is_letter() && !f.is_punctuation() && !f.is_symbol();
  if (may_lead && in_class(t, pos + 1, end, is_letter_or_mark))
    return 1 + run(t, pos + 1, end, is_letter_or_mark);
  if (f.is_letter() || f.is_mark()) return run(t, pos, end, is_letter_or_mark);
  if (size_t n = symbols_then_tail(t, pos, end, is_punct_or_symbol, spark ? Tail::none : Tail::line_breaks)) {
    return n;
  }
  if (spark) {
    // [\r\n]|\s+(?!\S)|\s+
    if (c == '\r' || c == '\n') return 1;
    return whitespace_run(t, pos, end);
  }
  return line_breaks_or_whitespace(t, pos, end);
}

}  // namespace

size_t deepseek_llm_letters(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_ranges(t, pos, end, k_deepseek_letters);
}

size_t deepseek_llm_punctuation(const CodepointText& t, size_t pos, size_t end) {
  return optional_whitespace_then_ranges(t, pos, end, k_deepseek_punctuation);
}

size_t cjk_kana_run(const CodepointText& t, size_t pos, size_t end) {
  return range_run(t, pos, end, k_cjk_kana);
}

size_t deepseek3(const CodepointText& t, size_t pos, size_t end) {
  return deepseek3_like(t, pos, end, false);
}

size_t spark2_5(const CodepointText& t, size_t pos, size_t end) { return deepseek3_like(t, pos, end, true); }

size_t afmoe_scripts(const CodepointText& t, size_t pos, size_t end) {
  return range_run(t, pos, end, k_afmoe_scripts);
}

size_t youtu_scripts(const CodepointText& t, size_t pos, size_t end) {
  for (std::span<const Range> cls :
       {std::span<const Range>(k_youtu_hangul), std::span<const Range>(k_youtu_punctuation),
        std::span<const Range>(k_youtu_bopomofo), std::span<const Range>(k_cjk_kana)}) {
    if (in_ranges(cls, t.cps[pos])) return range_run(t, pos, end, cls);
  }
  return 0;
}

}  // namespace ember::patterns
