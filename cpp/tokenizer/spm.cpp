// tokenizer/spm.cpp: SentencePiece-style encoding (tokenizer.ggml.model "llama"): start from
// single characters and repeatedly merge the adjacent pair whose concatenation is the
// highest-scoring token; characters left without a token fall back to <0xXX> byte tokens.
// Spaces are spelled "▁" before merging. O(n log n) in the text length.
#include <array>
#include <cstdio>
#include <queue>
#include <string>

#include "tokenizer/encoder.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

constexpr std::string_view k_space_mark = "\xE2\x96\x81";  // U+2581 "▁"

class SpmEncoder final : public Encoder {
 public:
  explicit SpmEncoder(const Vocab& vocab) : vocab_(vocab) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_tokens_[b] = vocab.find(name);
      if (byte_tokens_[b] < 0) {  // some vocabularies spell byte tokens as the byte itself
        const char raw = static_cast<char>(b);
        byte_tokens_[b] = vocab.find(std::string_view(&raw, 1));
      }
    }
  }

  void encode(std::string_view raw, std::vector<int32_t>& out) const override;

 private:
  // A run of the escaped text: one character at first, a token after merges. n == 0: merged away.
  struct Symbol {
    uint32_t begin;
    uint32_t n;
    int32_t prev;
    int32_t next;
  };
  // Merging symbols left and right would make a token of this score, spanning n bytes.
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    uint32_t n;
  };
  // Highest score first; the leftmost pair breaks ties.
  struct LowerPriority {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  using Queue = std::priority_queue<Bigram, std::vector<Bigram>, LowerPriority>;

  // The token a piece of text merges into: normal and user-defined ones only (SentencePiece
  // never produces control, unknown, unused or byte pieces from text).
  int32_t find_piece(std::string_view text) const {
    const int32_t id = vocab_.find(text);
    if (id < 0) return -1;
    const TokenType type = vocab_.token(id).type;
    const bool usable = type == TokenType::normal || type == TokenType::user_defined ||
                        type == TokenType::undefined;
    return usable ? id : -1;
  }

  void try_add_bigram(const std::string& text, const std::vector<Symbol>& symbols, int32_t left,
                      int32_t right, Queue& queue) const {
    if (left < 0 || right < 0) return;
    const uint32_t n = symbols[left].n + symbols[right].n;
    const int32_t id = find_piece(std::string_view(text).substr(symbols[left].begin, n));
    if (id < 0) return;
    queue.push({vocab_.token(id).score, left, right, n});
  }

  const Vocab& vocab_;
  std::array<int32_t, 256> byte_tokens_{};
};

void SpmEncoder::encode(std::string_view raw, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 4);
  for (char c : raw) {
    if (c == ' ') {
      text += k_space_mark;
    } else {
      text += c;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t n = utf8::decode(text, pos).n_bytes;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), n, index - 1, pos + n == text.size() ? -1 : index + 1});
    pos += n;
  }
  Queue queue;
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) {
    try_add_bigram(text, symbols, i - 1, i, queue);
  }
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale when either side has changed since the pair was queued.
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.n) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(text, symbols, left.prev, bigram.left, queue);
    try_add_bigram(text, symbols, bigram.left, left.next, queue);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view piece = std::string_view(text).substr(s.begin, s.n);
    const int32_t id = find_piece(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte fallback; a character the byte tokens cannot spell becomes one <unk>.
    bool spelled = true;
    for (char c : piece) spelled = spelled && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
    if (spelled) {
      for (char c : piece) out.push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    } else if (vocab_.ids().unk >= 0) {
      out.push_back(vocab_.ids().unk);
    }
  }
}

}  // namespace

std::unique_ptr<Encoder> make_spm_encoder(const Vocab& vocab) { return std::make_unique<SpmEncoder>(vocab); }

}  // namespace ember
