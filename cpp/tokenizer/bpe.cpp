// tokenizer/bpe.cpp: BPE (tokenizer.ggml.model "gpt2", "gemma4", "whitespace"): pre-tokenize into
// words, then apply the ranked merges (tokenizer.ggml.merges, lowest rank first, leftmost first on
// ties) until none applies. Byte-level vocabularies spell each word's bytes with GPT-2's
// byte-to-unicode map and merge from bytes; SentencePiece-style ones (PreTokenizerSpec::raw_utf8)
// merge from UTF-8 characters, spell spaces "▁", and fall back to <0xXX> tokens for characters
// no token spells. Merges are looked up by token-id pairs in a hash map, so each word costs
// O(m log m).
#include <array>
#include <queue>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/encoder.h"
#include "tokenizer/flat_index.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

constexpr std::string_view k_space_mark = "\xE2\x96\x81";  // U+2581 "▁"

// How the text is rewritten before splitting: spaces as "▁", letters lower-cased.
struct Normalization {
  bool escape_spaces = false;
  bool lowercase = false;
  bool any() const { return escape_spaces || lowercase; }
  void apply(std::string_view text, std::string& out) const {
    out.clear();
    out.reserve(text.size() + text.size() / 2);
    for (size_t pos = 0; pos < text.size();) {
      if (escape_spaces && text[pos] == ' ') {
        out += k_space_mark;
        ++pos;
      } else if (lowercase) {
        const utf8::Decoded d = utf8::decode(text, pos);
        if (d.valid) utf8::append(unicode::to_lower(d.cp), out);
        else out.append(text.substr(pos, d.n_bytes));
        pos += d.n_bytes;
      } else {
        out += text[pos++];
      }
    }
  }
};

class BpeEncoder final : public Encoder {
 public:
  BpeEncoder(const Vocab& vocab, const GGUFFile& file, PreTokenizerSpec spec);
  void encode(std::string_view text, std::vector<int32_t>& out) const override;

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // The token spelling all of `word` when it is kept whole rather than merged, -1 otherwise.
  int32_t whole_word_token(std::string_view word) const;

  const Vocab& vocab_;
  PreTokenizer pre_;
  bool ignore_merges_;
  bool raw_utf8_;
  bool whole_newline_runs_;
  bool drop_whitespace_;  // the gaps between words are no tokens
  Normalization normalization_;
  std::array<int32_t, 256> byte_tokens_{};  // the token spelling each single byte, -1 if none
  MergeIndex merges_;                       // (left id, right id) -> rank and resulting id
};

BpeEncoder::BpeEncoder(const Vocab& vocab, const GGUFFile& file, PreTokenizerSpec spec)
    : vocab_(vocab),
      pre_(std::move(spec.passes)),
      ignore_merges_(spec.ignore_merges),
      raw_utf8_(spec.raw_utf8),
      whole_newline_runs_(spec.whole_newline_runs),
      drop_whitespace_(spec.drops_whitespace || vocab.model_name() == "whitespace"),
      normalization_{spec.escape_spaces,
                     drop_whitespace_ && file.get_bool("tokenizer.ggml.normalizer.lowercase", false)} {
  static constexpr char k_hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    if (raw_utf8_) {
      spelled = {'<', '0', 'x', k_hex[b >> 4], k_hex[b & 15], '>'};
    } else {
      byte_level::encode(std::string_view(reinterpret_cast<const char*>(&b), 1), spelled);
    }
    byte_tokens_[b] = vocab.find(spelled);
  }
  const std::vector<std::string_view> merges = file.get_strings("tokenizer.ggml.merges");
  if (merges.empty()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata 'tokenizer.ggml.merges' is missing or ",
                          "empty (a \"", vocab.model_name(), "\" tokenizer needs its BPE merges)"));
  }
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view m = merges[rank];
    const size_t space = m.find(' ', 1);  // from 1: a merge may start with a literal space
    if (space == std::string_view::npos) {
      throw FormatError(cat("[tokenizer] ", file.path(), ": tokenizer.ggml.merges[", rank, "] = '", m,
                            "': expected two tokens separated by a space"));
    }
    const std::string_view left = m.substr(0, space), right = m.substr(space + 1);
    const int32_t left_id = vocab.find(left), right_id = vocab.find(right);
    joined.assign(left);
    joined.append(right);
    const int32_t result = vocab.find(joined);
    // A merge whose parts or result are not tokens can never produce a token; Hugging Face
    // refuses such files, llama.cpp ignores the merge in effect. Skip it.
    if (left_id < 0 || right_id < 0 || result < 0) continue;
    merges_.insert(left_id, right_id, {static_cast<int32_t>(rank), result});
  }
}

void BpeEncoder::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (normalization_.any()) {
    normalization_.apply(text, normalized);
    text = normalized;
  }
  PreTokenizer::Scratch scratch;
  std::vector<std::pair<size_t, size_t>> words;
  pre_.split(text, words, scratch);
  for (const auto& [begin, end] : words) {
    const std::string_view word = text.substr(begin, end - begin);
    // \S+ leaves the whitespace as gaps, each all whitespace: its first code point tells.
    if (drop_whitespace_ && !word.empty() && unicode::flags(utf8::decode(word, 0).cp).is_whitespace())
      continue;
    encode_word(word, out);
  }
}

int32_t BpeEncoder::whole_word_token(std::string_view word) const {
  const bool newlines = whole_newline_runs_ && word.find_first_not_of('\n') == std::string_view::npos;
  int32_t id = -1;
  if (raw_utf8_) {
    if (ignore_merges_ || newlines) id = vocab_.find(word);
  } else if (ignore_merges_ || word.size() == 1) {
    std::string spelled;
    byte_level::encode(word, spelled);
    id = vocab_.find(spelled);
  }
  return id >= 0 && vocab_.token(id).type == TokenType::normal ? id : -1;
}

void BpeEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (const int32_t id = whole_word_token(word); id >= 0) {
    out.push_back(id);
    return;
  }
  // One symbol per byte (byte-level) or per UTF-8 character at first; a merged symbol takes over
  // its right neighbour's bytes.
  struct Symbol {
    int32_t id;  // -1: no token spells it (its bytes fall back to byte tokens, or are dropped)
    int32_t prev;
    int32_t next;
    uint32_t begin, end;  // its bytes in `word`
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  struct LaterFirst {  // lowest rank on top, leftmost on ties
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const size_t n = raw_utf8_ ? utf8::decode(word, pos).n_bytes : 1;
    const int32_t id = raw_utf8_ ? vocab_.find(word.substr(pos, n))
                                 : byte_tokens_[static_cast<uint8_t>(word[pos])];
    const auto i = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, i - 1, -1, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + n), true});
    if (i > 0) symbols[i - 1].next = i;
    pos += n;
  }
  const auto n = static_cast<int32_t>(symbols.size());
  std::priority_queue<Candidate, std::vector<Candidate>, LaterFirst> queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t a = symbols[left].id, b = symbols[right].id;
    if (a < 0 || b < 0) return;
    if (const MergeIndex::Merge* m = merges_.find(a, b)) queue.push({m->rank, left, right, a, b, m->result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    // Stale when either side was merged since the candidate was queued.
    if (!left.alive || !right.alive || left.next != c.right || left.id != c.left_id ||
        right.id != c.right_id) {
      continue;
    }
    left.id = c.result;
    left.end = right.end;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    for (uint32_t b = s.begin; b < s.end; ++b) {  // as llama.cpp: bytes without a token are dropped
      if (const int32_t id = byte_tokens_[static_cast<uint8_t>(word[b])]; id >= 0) out.push_back(id);
    }
  }
}

}  // namespace

std::unique_ptr<Encoder> make_bpe_encoder(const Vocab& vocab, const GGUFFile& file) {
  std::optional<PreTokenizerSpec> spec = find_pre_tokenizer(vocab.pre_name());
  if (!spec) {
    throw Unsupported(cat("[tokenizer] ", file.path(), ": pre-tokenizer '", vocab.pre_name(),
                          "' (tokenizer.ggml.pre) is not supported; known: ", known_pre_tokenizers()));
  }
  return std::make_unique<BpeEncoder>(vocab, file, std::move(*spec));
}

}  // namespace ember
