// sampling/llguidance.h: grammars compiled by llguidance (JSON Schema, Lark, regex) for one
// vocabulary, with a cache of recently compiled ones. llguidance is the library llama.cpp, vLLM
// and SGLang use for this; ember opens the shared library of the `llguidance` Python package at
// run time and calls its C ABI, so masks are computed on the engine thread without the GIL.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sampling/constraint.h"
#include "sampling/llguidance_api.h"

namespace ember {

class Tokenizer;

// The opened library. Throws Unsupported when `path` cannot be opened, lacks a function, or is
// another version than the ABI ember was written against.
class Llguidance {
 public:
  static std::shared_ptr<const Llguidance> open(const std::string& path);
  const llg::Api& api() const { return api_; }
  std::string version() const { return api_.get_version(); }

 private:
  llg::Api api_{};
  void* handle_ = nullptr;  // never closed: matchers may outlive any one owner
};

class GrammarCompiler {
 public:
  // The vocabulary as llguidance sees it: each token's bytes (control tokens marked so that no
  // text matches them), end-of-generation tokens as its EOS set.
  GrammarCompiler(std::shared_ptr<const Llguidance> lib, const Tokenizer& tokenizer, size_t cache_size = 64);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // kind: "json_schema" (data: a JSON Schema as JSON text), "lark" (llguidance's Lark dialect)
  // or "regex". Throws InvalidArgument with llguidance's message for a grammar it rejects,
  // e.g. `Unimplemented keys: ["uniqueItems"]`. A grammar compiled before comes from the cache.
  // Thread-safe.
  std::shared_ptr<const Grammar> compile(const std::string& kind, const std::string& data);

  int32_t n_vocab() const { return n_vocab_; }
  int64_t n_compiled() const;  // compilations done (cache misses)

 private:
  std::shared_ptr<const Llguidance> lib_;
  int32_t n_vocab_ = 0;
  int32_t eos_ = 0;
  llg::Tokenizer* tokenizer_ = nullptr;
  size_t cache_size_;
  mutable std::mutex mutex_;
  using Key = std::pair<std::string, std::string>;  // (kind, data)
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  std::list<Key> lru_;  // most recent first
  std::unordered_map<Key, std::pair<std::shared_ptr<const Grammar>, std::list<Key>::iterator>, KeyHash>
      cache_;
  int64_t n_compiled_ = 0;
};

}  // namespace ember
