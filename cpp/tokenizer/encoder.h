// tokenizer/encoder.h: the interface of the three tokenization algorithms (SentencePiece-style
// merging, byte-level BPE, WordPiece), each turning raw text without special tokens into ids.
// Special tokens, BOS/EOS and the SentencePiece space prefix are the Tokenizer's business.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace ember {

class GGUFFile;
class Vocab;

class Encoder {
 public:
  virtual ~Encoder() = default;
  // Appends the ids of `text` to `out`. Thread-safe: encoders hold no mutable state.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
};

// Each keeps a reference to `vocab`, which must outlive it. They throw FormatError or
// Unsupported for vocabularies they cannot work with.
std::unique_ptr<Encoder> make_spm_encoder(const Vocab& vocab);
std::unique_ptr<Encoder> make_bpe_encoder(const Vocab& vocab, const GGUFFile& file);  // reads the merges
std::unique_ptr<Encoder> make_wpm_encoder(const Vocab& vocab);

}  // namespace ember
