// tokenizer/tokenizer.cpp: the Tokenizer facade — picks the algorithm, frames encoded text with
// BOS/EOS, applies SentencePiece's leading space, and renders ids back to text.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/utf8.h"

namespace ember {

namespace {

constexpr std::string_view k_space_mark = "\xE2\x96\x81";  // U+2581 "▁"

// "▁" -> " " (SentencePiece and WordPiece spell spaces and word starts that way).
std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos, k_space_mark.size()) == k_space_mark) {
      out += ' ';
      pos += k_space_mark.size();
    } else {
      out += text[pos++];
    }
  }
  return out;
}

// The byte of a "<0xXX>" token, -1 when the text is not one.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') value |= c - '0';
    else if (c >= 'A' && c <= 'F') value |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value |= c - 'a' + 10;
    else return -1;
  }
  return value;
}

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::from_gguf(const GGUFFile& file) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->vocab_ = Vocab::from_gguf(file);
  switch (t->vocab_->kind()) {
    case VocabKind::spm: t->encoder_ = make_spm_encoder(*t->vocab_); break;
    case VocabKind::bpe: t->encoder_ = make_bpe_encoder(*t->vocab_, file); break;
    case VocabKind::wpm: t->encoder_ = make_wpm_encoder(*t->vocab_); break;
  }
  t->strip_first_space_ = t->vocab_->kind() == VocabKind::wpm ||
                          (t->vocab_->kind() == VocabKind::spm && t->vocab_->add_space_prefix());
  t->render_pieces();
  return t;
}

std::shared_ptr<const Tokenizer> Tokenizer::open(const std::string& path) {
  return from_gguf(*GGUFFile::open(path));
}

void Tokenizer::render_pieces() {
  const Vocab& v = *vocab_;
  // BPE tokens spell bytes in GPT-2's map, or raw UTF-8 with "▁" for spaces (SentencePiece-style).
  std::optional<PreTokenizerSpec> spec;
  if (v.kind() == VocabKind::bpe) spec = find_pre_tokenizer(v.pre_name());
  const bool byte_level_bpe = spec && !spec->raw_utf8;
  const bool escaped_spaces = v.kind() != VocabKind::bpe || (spec && spec->escape_spaces);
  pieces_.resize(v.size());
  for (int32_t id = 0; id < v.size(); ++id) {
    const TokenInfo& t = v.token(id);
    std::string& piece = pieces_[id];
    switch (t.type) {
      case TokenType::byte: {
        const int b = parse_byte_token(t.text);
        piece = b >= 0 ? std::string(1, static_cast<char>(b)) : t.text;
        break;
      }
      case TokenType::normal:
      case TokenType::undefined:
      case TokenType::unused:
        if (byte_level_bpe) {
          byte_level::decode(t.text, piece);
        } else if (escaped_spaces) {
          piece = unescape_spaces(t.text);
        } else {
          piece = t.text;
        }
        break;
      default:  // control, unknown, user-defined: their text as written
        piece = t.text;
        break;
    }
  }
}

void Tokenizer::check_id(int64_t id) const {
  if (id < 0 || id >= vocab_->size()) {
    throw InvalidArgument(
        cat("[tokenizer] token id ", id, " is out of range (expected 0 <= id < ", vocab_->size(), ")"));
  }
}

bool Tokenizer::is_special(int32_t id) const {
  const TokenType type = vocab_->token(id).type;
  return type == TokenType::control || type == TokenType::unknown;
}

std::string_view Tokenizer::piece(int32_t id, bool render_special) const {
  check_id(id);
  if (!render_special && is_special(id)) return {};
  return pieces_[id];
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Vocab& v = *vocab_;
  const SpecialTokenIds& ids = v.ids();
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && v.add_bos() && ids.bos >= 0) out.push_back(ids.bos);
  // SentencePiece puts a space before the text, and again after every special token.
  const bool space_prefix = v.kind() == VocabKind::spm && v.add_space_prefix();
  bool after_special = true;
  std::string prefixed;
  for (const Fragment& f : split_special_tokens(v, text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.end - f.begin);
    if (space_prefix && after_special) {
      prefixed.assign(1, ' ');
      prefixed.append(raw);
      encoder_->encode(prefixed, out);
    } else {
      encoder_->encode(raw, out);
    }
    after_special = false;
  }
  if (add_special && v.add_eos() && ids.eos >= 0) out.push_back(ids.eos);
  if (add_special && v.add_sep() && ids.sep >= 0) out.push_back(ids.sep);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  for (int32_t id : ids) check_id(id);  // before any work: a bad id is the caller's mistake
  std::string bytes;
  bool at_start = true;  // nothing rendered yet
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    std::string_view p = pieces_[id];
    if (at_start && !is_special(id)) {  // the first text token: the one the space was put on
      if (strip_first_space_ && !p.empty() && p[0] == ' ') p.remove_prefix(1);
      at_start = false;
    } else if (!p.empty()) {
      at_start = false;  // a special token rendered as text comes first: keep the space
    }
    bytes.append(p);
  }
  std::string out;
  out.reserve(bytes.size());
  utf8::append_replacing_invalid(bytes, out, /*final=*/true);
  return out;
}

}  // namespace ember
