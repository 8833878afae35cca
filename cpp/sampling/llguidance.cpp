// sampling/llguidance.cpp: opening llguidance, building its view of a vocabulary, and the
// Grammar / TokenConstraint pair over its matchers.
#include "sampling/llguidance.h"

#include <dlfcn.h>

#include <cstring>
#include <functional>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ember {
namespace {

// llguidance's marker for tokens that stand for no text (its TokTrie::SPECIAL_TOKEN_MARKER).
constexpr uint8_t kSpecialTokenMarker = 0xFF;

void free_matcher(const llg::Api& api, llg::Matcher* m) {
  if (m) api.free_matcher(m);
}

class LlgConstraint : public TokenConstraint {
 public:
  LlgConstraint(std::shared_ptr<const Llguidance> lib, llg::Matcher* matcher, int32_t n_vocab, int32_t eos)
      : lib_(std::move(lib)), matcher_(matcher), n_vocab_(n_vocab), eos_(eos) {}
  ~LlgConstraint() override { free_matcher(lib_->api(), matcher_); }

  void fill_mask(uint32_t* mask) override {
    const size_t n_words = mask_words(n_vocab_);
    const int32_t rc = lib_->api().matcher_compute_mask_into(matcher_, mask, n_words * sizeof(uint32_t));
    bool any = false;
    if (rc == 0) {
      for (size_t i = 0; i < n_words && !any; ++i) any = mask[i] != 0;
    }
    // Nothing can follow (the grammar ended, or the matcher failed): only EOS, so the request
    // ends rather than leaving the grammar.
    if (!any) {
      std::memset(mask, 0, n_words * sizeof(uint32_t));
      mask[eos_ >> 5] |= 1u << (eos_ & 31);
    }
  }

  bool advance(int32_t token) override {
    return lib_->api().matcher_consume_token(matcher_, static_cast<uint32_t>(token)) == 0;
  }

  bool is_accepting() override { return lib_->api().matcher_is_accepting(matcher_); }

  std::string error() override {
    const char* e = lib_->api().matcher_get_error(matcher_);
    return e ? e : "";
  }

 private:
  std::shared_ptr<const Llguidance> lib_;
  llg::Matcher* matcher_;
  int32_t n_vocab_;
  int32_t eos_;
};

// A matcher that never advances; every request clones it.
class LlgGrammar : public Grammar {
 public:
  LlgGrammar(std::shared_ptr<const Llguidance> lib, llg::Matcher* prototype, int32_t n_vocab, int32_t eos)
      : lib_(std::move(lib)), prototype_(prototype), n_vocab_(n_vocab), eos_(eos) {}
  ~LlgGrammar() override { free_matcher(lib_->api(), prototype_); }

  std::unique_ptr<TokenConstraint> start() const override {
    llg::Matcher* m;
    {
      std::lock_guard lock(mutex_);
      m = lib_->api().clone_matcher(prototype_);
    }
    return std::make_unique<LlgConstraint>(lib_, m, n_vocab_, eos_);
  }
  int32_t n_vocab() const override { return n_vocab_; }

 private:
  std::shared_ptr<const Llguidance> lib_;
  llg::Matcher* prototype_;
  int32_t n_vocab_;
  int32_t eos_;
  mutable std::mutex mutex_;
};

template <typename F>
void bind(void* handle, const std::string& path, const char* name, F& fn) {
  void* sym = dlsym(handle, name);
  if (!sym) throw Unsupported(cat("[grammar] ", path, " has no function ", name));
  fn = reinterpret_cast<F>(sym);
}

}  // namespace

std::shared_ptr<const Llguidance> Llguidance::open(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Unsupported(cat("[grammar] cannot open llguidance (", path, "): ", why ? why : "unknown error"));
  }
  auto lib = std::shared_ptr<Llguidance>(new Llguidance());
  lib->handle_ = handle;
  llg::Api& a = lib->api_;
  bind(handle, path, "llg_get_version", a.get_version);
  const std::string version = a.get_version();
  if (!version.starts_with(llg::kVersionTag)) {
    throw Unsupported(cat("[grammar] ", version, " is installed; ember needs ", llg::kVersion,
                          " (pip install llguidance==", llg::kVersion, ")"));
  }
  bind(handle, path, "llg_new_tokenizer_v2", a.new_tokenizer_v2);
  bind(handle, path, "llg_free_tokenizer", a.free_tokenizer);
  bind(handle, path, "llg_constraint_init_set_defaults", a.constraint_init_set_defaults);
  bind(handle, path, "llg_new_matcher", a.new_matcher);
  bind(handle, path, "llg_clone_matcher", a.clone_matcher);
  bind(handle, path, "llg_free_matcher", a.free_matcher);
  bind(handle, path, "llg_matcher_get_error", a.matcher_get_error);
  bind(handle, path, "llg_matcher_compute_mask_into", a.matcher_compute_mask_into);
  bind(handle, path, "llg_matcher_consume_token", a.matcher_consume_token);
  bind(handle, path, "llg_matcher_is_accepting", a.matcher_is_accepting);
  return lib;
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Llguidance> lib, const Tokenizer& tokenizer,
                                 size_t cache_size)
    : lib_(std::move(lib)), n_vocab_(tokenizer.n_vocab()), cache_size_(std::max<size_t>(1, cache_size)) {
  if (!lib_) throw InvalidArgument("[grammar] no llguidance library");
  std::vector<uint32_t> lens(static_cast<size_t>(n_vocab_));
  std::string bytes;
  std::vector<uint32_t> eog;
  for (int32_t id = 0; id < n_vocab_; ++id) {
    const size_t before = bytes.size();
    if (tokenizer.is_special(id)) bytes.push_back(static_cast<char>(kSpecialTokenMarker));
    bytes.append(tokenizer.piece(id, /*render_special=*/true));
    lens[static_cast<size_t>(id)] = static_cast<uint32_t>(bytes.size() - before);
    if (tokenizer.is_eog(id)) eog.push_back(static_cast<uint32_t>(id));
  }
  if (eog.empty()) throw Unsupported("[grammar] the vocabulary has no end-of-generation token");
  const int32_t eos = tokenizer.eos();
  eos_ = tokenizer.is_eog(eos) ? eos : static_cast<int32_t>(eog.front());
  std::vector<uint32_t> extra;
  for (uint32_t t : eog) {
    if (static_cast<int32_t>(t) != eos_) extra.push_back(t);
  }
  llg::TokenizerInitV2 init{};
  init.struct_size = sizeof(init);
  init.vocab_size = static_cast<uint32_t>(n_vocab_);
  init.tok_eos = static_cast<uint32_t>(eos_);
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  // Grammars are applied to sampled tokens only; llguidance tokenizes nothing that matters here.
  init.use_approximate_greedy_tokenize_fn = true;
  init.tok_eos_extra = extra.data();
  init.tok_eos_extra_count = static_cast<uint32_t>(extra.size());
  char error[1024] = {0};
  tokenizer_ = lib_->api().new_tokenizer_v2(&init, error, sizeof(error));
  if (!tokenizer_) throw InvalidArgument(cat("[grammar] llguidance rejected the vocabulary: ", error));
}

GrammarCompiler::~GrammarCompiler() {
  if (tokenizer_) lib_->api().free_tokenizer(tokenizer_);
}

size_t GrammarCompiler::KeyHash::operator()(const Key& k) const {
  return std::hash<std::string>()(k.first) * 31 + std::hash<std::string>()(k.second);
}

int64_t GrammarCompiler::n_compiled() const {
  std::lock_guard lock(mutex_);
  return n_compiled_;
}

std::shared_ptr<const Grammar> GrammarCompiler::compile(const std::string& kind, const std::string& data) {
  if (kind != "json_schema" && kind != "lark" && kind != "regex") {
    throw InvalidArgument(cat("[grammar] unknown grammar kind '", kind, "'; use json_schema, lark or regex"));
  }
  Key key{kind, data};
  {
    std::lock_guard lock(mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  const llg::Api& api = lib_->api();
  llg::ConstraintInit init{};
  api.constraint_init_set_defaults(&init, tokenizer_);
  init.log_stderr_level = 0;
  init.log_buffer_level = 0;
  llg::Matcher* m = api.new_matcher(&init, kind.c_str(), data.c_str());
  if (const char* e = api.matcher_get_error(m)) {
    std::string message = e;
    api.free_matcher(m);
    throw InvalidArgument(cat("[grammar] ", message));
  }
  auto grammar = std::make_shared<const LlgGrammar>(lib_, m, n_vocab_, eos_);
  std::lock_guard lock(mutex_);
  ++n_compiled_;
  const auto it = cache_.find(key);  // another thread may have compiled it meanwhile
  if (it != cache_.end()) return it->second.first;
  lru_.push_front(key);
  cache_.emplace(std::move(key), std::make_pair(grammar, lru_.begin()));
  if (cache_.size() > cache_size_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return grammar;
}

}  // namespace ember
