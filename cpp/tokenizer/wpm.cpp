// tokenizer/wpm.cpp: WordPiece (tokenizer.ggml.model "bert"), as Hugging Face's BertNormalizer,
// BertPreTokenizer and WordPiece do it for uncased BERT vocabularies: drop control characters,
// put spaces around CJK ideographs, strip accents (NFD without nonspacing marks), lower-case;
// split on whitespace and around punctuation; then cut each word greedily into the longest
// vocabulary pieces. The GGUF spells word-initial pieces "▁piece" and continuations "piece"
// (the "##" prefix removed), so a word is matched as "▁" + word.
#include <algorithm>
#include <string>

#include "tokenizer/encoder.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

constexpr std::string_view k_word_mark = "\xE2\x96\x81";  // U+2581 "▁"
constexpr size_t k_max_word_chars = 100;                  // longer words become [UNK]

bool is_cjk_ideograph(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertPreTokenizer's punctuation: all of ASCII's non-alphanumeric printables, and \p{P}.
bool is_bert_punctuation(uint32_t c, unicode::CodepointFlags f) {
  const bool ascii_punct = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                           (c >= 123 && c <= 126);
  return ascii_punct || f.is_punctuation();
}

class WpmEncoder final : public Encoder {
 public:
  explicit WpmEncoder(const Vocab& vocab) : vocab_(vocab) {
    for (int32_t id = 0; id < vocab.size(); ++id) {
      max_piece_bytes_ = std::max(max_piece_bytes_, vocab.token(id).text.size());
    }
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<uint32_t> normalized = normalize(text);
    std::vector<uint32_t> word;
    auto finish_word = [&] {
      if (!word.empty()) encode_word(word, out);
      word.clear();
    };
    for (uint32_t c : normalized) {
      const unicode::CodepointFlags f = unicode::flags(c);
      if (f.is_whitespace()) {
        finish_word();
      } else if (is_bert_punctuation(c, f)) {
        finish_word();
        word.push_back(c);
        finish_word();
      } else {
        word.push_back(c);
      }
    }
    finish_word();
  }

 private:
  // BertNormalizer with clean_text, handle_chinese_chars, strip_accents and lowercase.
  static std::vector<uint32_t> normalize(std::string_view text) {
    std::vector<uint32_t> out, stripped;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const utf8::Decoded d = utf8::decode(text, pos);
      pos += d.n_bytes;
      const uint32_t c = d.cp;
      const unicode::CodepointFlags f = unicode::flags(c);
      const bool kept_control = c == '\t' || c == '\n' || c == '\r';
      if (c == 0 || c == utf8::k_replacement || (f.is_control() && !kept_control)) continue;
      if (f.is_whitespace()) {
        out.push_back(' ');
        continue;
      }
      if (is_cjk_ideograph(c)) {
        out.insert(out.end(), {' ', c, ' '});
        continue;
      }
      stripped.clear();
      unicode::append_without_accents(c, stripped);
      for (uint32_t s : stripped) out.push_back(unicode::to_lower(s));
    }
    return out;
  }

  void encode_word(const std::vector<uint32_t>& word, std::vector<int32_t>& out) const {
    if (word.size() > k_max_word_chars) {
      push_unknown(out);
      return;
    }
    // Byte offsets of each character in "▁" + word, so pieces end on character boundaries.
    std::string spelled(k_word_mark);
    std::vector<size_t> ends;  // ends[k]: the end of character k
    for (uint32_t c : word) {
      utf8::append(c, spelled);
      ends.push_back(spelled.size());
    }
    const size_t n_before = out.size();
    size_t begin = 0;  // the first piece includes the mark
    size_t k = 0;      // characters consumed
    while (k < word.size()) {
      int32_t found = -1;
      size_t j = word.size();
      for (; j > k; --j) {
        if (ends[j - 1] - begin > max_piece_bytes_) continue;
        found = vocab_.find(std::string_view(spelled).substr(begin, ends[j - 1] - begin));
        if (found >= 0) break;
      }
      if (found < 0) {  // one unmatched position makes the whole word unknown
        out.resize(n_before);
        push_unknown(out);
        return;
      }
      out.push_back(found);
      k = j;
      begin = ends[j - 1];
    }
  }

  void push_unknown(std::vector<int32_t>& out) const {
    if (vocab_.ids().unk >= 0) out.push_back(vocab_.ids().unk);
  }

  const Vocab& vocab_;
  size_t max_piece_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Encoder> make_wpm_encoder(const Vocab& vocab) { return std::make_unique<WpmEncoder>(vocab); }

}  // namespace ember
