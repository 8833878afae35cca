// tokenizer/vocab.cpp: loads a Vocab from GGUF metadata, with llama.cpp's defaults for keys that
// older converters did not write (so files that llama.cpp reads load the same way here).
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/pre_tokenizer.h"

namespace ember {

namespace {

constexpr std::string_view k_tokens_key = "tokenizer.ggml.tokens";

// Texts of end-of-turn tokens that older converters did not record as eot/eos ids
// (llama.cpp recognises the same list).
constexpr std::string_view k_eot_texts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>",      "<EOT>",      "_<EOT>",  "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
};
constexpr std::string_view k_eog_texts[] = {
    "<|eot_id|>",      "<|im_end|>",         "<|end|>",    "<|return|>", "<|call|>",
    "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>", "<EOT>",      "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>",      "<turn|>",    "<|tool_response>",  // Gemma 4
};

std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TokenType token_type_from(int64_t v) {
  return (v >= 0 && v <= 6) ? static_cast<TokenType>(v) : TokenType::undefined;
}

}  // namespace

std::unique_ptr<const Vocab> Vocab::from_gguf(const GGUFFile& file) {
  std::unique_ptr<Vocab> v(new Vocab());
  v->source_ = file.path();
  v->model_ = file.get_string("tokenizer.ggml.model");
  v->pre_ = file.get_string("tokenizer.ggml.pre", "default");
  if (v->pre_.empty()) v->pre_ = "default";
  if (file.find(k_tokens_key) == nullptr) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": no tokenizer in this file: metadata '",
                          k_tokens_key, "' is missing (expected a GGUF with a vocabulary)"));
  }
  if (v->model_ == "llama") {
    v->kind_ = VocabKind::spm;
  } else if (v->model_ == "gpt2" || v->model_ == "whitespace") {
    v->kind_ = VocabKind::bpe;  // "whitespace": BPE that drops the whitespace between words (bpe.cpp)
  } else if (v->model_ == "gemma4") {
    v->kind_ = VocabKind::bpe;  // SentencePiece-style BPE; llama.cpp ignores tokenizer.ggml.pre here
    v->pre_ = "gemma4";
  } else if (v->model_ == "bert") {
    v->kind_ = VocabKind::wpm;
  } else if (v->model_.empty()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata 'tokenizer.ggml.model' is missing",
                          " (expected \"llama\", \"gpt2\", \"gemma4\", \"whitespace\" or \"bert\")"));
  } else {
    throw Unsupported(
        cat("[tokenizer] ", file.path(), ": tokenizer.ggml.model '", v->model_,
            "' is not supported (supported: \"llama\", \"gpt2\", \"gemma4\", \"whitespace\", \"bert\")"));
  }
  v->read_tokens(file);
  v->read_special_ids(file);

  const bool spm = v->kind_ == VocabKind::spm, wpm = v->kind_ == VocabKind::wpm;
  bool bos_default = spm || wpm, sep_default = wpm, bos_forced = false;
  if (v->kind_ == VocabKind::bpe) {
    const auto spec = find_pre_tokenizer(v->pre_);
    bos_default = spec && spec->adds_bos;
    sep_default = spec && spec->adds_sep;
    bos_forced = spec && spec->forces_bos;
  }
  v->add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token", bos_default) || bos_forced;
  v->add_eos_ = file.get_bool("tokenizer.ggml.add_eos_token", false);
  v->add_sep_ = file.get_bool("tokenizer.ggml.add_sep_token", sep_default);
  v->add_space_prefix_ = file.get_bool("tokenizer.ggml.add_space_prefix", spm);

  v->find_end_of_generation();
  v->set_strip_flags(file);
  v->index_special_tokens();
  return v;
}

void Vocab::read_tokens(const GGUFFile& file) {
  const std::vector<std::string_view> texts = file.get_strings(k_tokens_key);
  if (texts.empty()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata '", k_tokens_key,
                          "' is empty (expected at least one token)"));
  }
  if (texts.size() > static_cast<size_t>(INT32_MAX)) {
    throw FormatError(
        cat("[tokenizer] ", file.path(), ": ", texts.size(), " tokens (expected at most ", INT32_MAX, ")"));
  }
  const std::vector<float> scores = file.get_floats("tokenizer.ggml.scores");
  const std::vector<int64_t> types = file.get_ints("tokenizer.ggml.token_type");
  if (!scores.empty() && scores.size() != texts.size()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata 'tokenizer.ggml.scores' has ",
                          scores.size(), " entries, expected one per token (", texts.size(), ")"));
  }
  if (!types.empty() && types.size() != texts.size()) {
    throw FormatError(cat("[tokenizer] ", file.path(), ": metadata 'tokenizer.ggml.token_type' has ",
                          types.size(), " entries, expected one per token (", texts.size(), ")"));
  }
  tokens_.resize(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    TokenInfo& t = tokens_[i];
    t.text = std::string(texts[i]);
    if (!scores.empty()) t.score = scores[i];
    if (!types.empty()) t.type = token_type_from(types[i]);
  }
  by_text_.build(size());  // after every string is in place: the index reads them
}

void Vocab::read_special_ids(const GGUFFile& file) {
  // Defaults of the SentencePiece and BERT conventions, used when the key is absent.
  if (kind_ == VocabKind::spm) {
    ids_.unk = 0, ids_.bos = 1, ids_.eos = 2;
  } else if (kind_ == VocabKind::wpm) {
    ids_.pad = 0, ids_.unk = 100, ids_.cls = 101, ids_.sep = 102, ids_.mask = 103;
  }
  // An absent key, -1 stored as u32 (4294967295) or an id past the vocabulary means "none"
  // (llama.cpp ignores such ids the same way).
  auto read = [&](std::string_view key, int32_t& id) {
    if (file.find(key) == nullptr) {
      if (!contains(id)) id = -1;
      return;
    }
    const int64_t v = file.get_int(key, -1);
    id = (v >= 0 && v < size()) ? static_cast<int32_t>(v) : -1;
  };
  read("tokenizer.ggml.bos_token_id", ids_.bos);
  read("tokenizer.ggml.eos_token_id", ids_.eos);
  read("tokenizer.ggml.eot_token_id", ids_.eot);
  read("tokenizer.ggml.eom_token_id", ids_.eom);
  read("tokenizer.ggml.unknown_token_id", ids_.unk);
  read("tokenizer.ggml.seperator_token_id", ids_.sep);  // sic: the key llama.cpp writes
  read("tokenizer.ggml.padding_token_id", ids_.pad);
  read("tokenizer.ggml.cls_token_id", ids_.cls);
  read("tokenizer.ggml.mask_token_id", ids_.mask);
  if (kind_ == VocabKind::wpm && ids_.bos < 0) ids_.bos = ids_.cls;  // BERT opens with [CLS]
}

int32_t Vocab::find(std::string_view text) const { return by_text_.find(text); }

void Vocab::find_end_of_generation() {
  // Tokens recognised by their text must never come out of plain text nor print as text, even
  // when the converter typed them as normal tokens; ids given by metadata keep their type.
  std::vector<int32_t> by_text;
  if (ids_.eot < 0) {
    for (std::string_view text : k_eot_texts) {
      const int32_t id = find(text);
      if (id >= 0) {
        ids_.eot = id;
        by_text.push_back(id);
        break;
      }
    }
  }
  for (std::string_view text : k_eog_texts) {
    const int32_t id = find(text);
    if (id >= 0) by_text.push_back(id);
  }
  for (int32_t id : by_text) {
    tokens_[id].type = TokenType::control;
    eog_.insert(id);
  }
  for (int32_t id : {ids_.eos, ids_.eot, ids_.eom}) {
    if (id >= 0) eog_.insert(id);
  }
}

void Vocab::set_strip_flags(const GGUFFile& file) {
  // Phi-3's special tokens swallow the whitespace after them (its tokenizer.json says
  // rstrip=true for them), except <unk>, <s> and <|endoftext|>. llama.cpp keys this on the name.
  const std::string name = lower_ascii(file.get_string("general.name"));
  const std::string arch = lower_ascii(file.get_string("general.architecture"));
  const bool phi3 = name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos ||
                    arch == "phi3";
  if (!phi3) return;
  for (TokenInfo& t : tokens_) {
    const bool special = t.type == TokenType::control || t.type == TokenType::user_defined ||
                         t.type == TokenType::unknown;
    if (special) t.rstrip = true;
  }
  for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
    const int32_t id = find(text);
    if (id >= 0) tokens_[id].rstrip = false;
  }
}

void Vocab::index_special_tokens() {
  for (int32_t id = 0; id < size(); ++id) {
    const TokenType type = tokens_[id].type;
    const bool special = type == TokenType::control || type == TokenType::user_defined ||
                         type == TokenType::unknown;
    if (special && !tokens_[id].text.empty()) special_tokens_.push_back(id);
  }
  // Longest first, so "<|im_start|>" is found before a shorter token inside it; ties by id.
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].text.size() > tokens_[b].text.size(); });
}

}  // namespace ember
