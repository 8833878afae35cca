// tokenizer/bpe.cpp: byte-level BPE (tokenizer.ggml.model "gpt2"): pre-tokenize into words,
// spell each word's bytes with GPT-2's byte-to-unicode map, then apply the ranked merges
// (tokenizer.ggml.merges, lowest rank first, leftmost first on ties) until none applies.
// Merges are looked up by token-id pairs in a hash map, so each word costs O(m log m).
#include <array>
#include <queue>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/encoder.h"
#include "tokenizer/flat_index.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace ember {

namespace {

class BpeEncoder final : public Encoder {
 public:
  BpeEncoder(const Vocab& vocab, const GGUFFile& file, PreTokenizerSpec spec);
  void encode(std::string_view text, std::vector<int32_t>& out) const override;

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab_;
  PreTokenizer pre_;
  bool ignore_merges_;
  std::array<int32_t, 256> byte_tokens_{};  // the token spelling each single byte, -1 if none
  MergeIndex merges_;                       // (left id, right id) -> rank and resulting id
};

BpeEncoder::BpeEncoder(const Vocab& vocab, const GGUFFile& file, PreTokenizerSpec spec)
    : vocab_(vocab), pre_(std::move(spec.passes)), ignore_merges_(spec.ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    byte_level::encode(std::string_view(reinterpret_cast<const char*>(&b), 1), spelled);
    byte_tokens_[b] = vocab.find(spelled);
  }
  const std::vector<std::string_view> merges = file.get_strings("tokenizer.ggml.merges");
  if (merges.empty()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata 'tokenizer.ggml.merges' is missing or ",
                          "empty (a \"gpt2\" tokenizer needs its BPE merges)"));
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
  PreTokenizer::Scratch scratch;
  std::vector<std::pair<size_t, size_t>> words;
  pre_.split(text, words, scratch);
  for (const auto& [begin, end] : words) encode_word(text.substr(begin, end - begin), out);
}

void BpeEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_ || word.size() == 1) {
    std::string spelled;
    byte_level::encode(word, spelled);
    const int32_t id = vocab_.find(spelled);
    if (id >= 0 && vocab_.token(id).type == TokenType::normal) {
      out.push_back(id);
      return;
    }
  }
  // One symbol per byte at first; a merged symbol takes over its right neighbour.
  struct Symbol {
    int32_t id;  // -1: a byte the vocabulary cannot spell (it is dropped, as llama.cpp does)
    int32_t prev;
    int32_t next;
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
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_tokens_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
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
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    if (symbols[i].id >= 0) out.push_back(symbols[i].id);
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
