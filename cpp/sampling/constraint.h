// sampling/constraint.h: what a grammar-constrained request gives its sampler — a compiled
// Grammar (immutable, shared by every request that asks for the same one) that starts one
// TokenConstraint per request, whose state follows the request's output token by token.
// The sampler masks each step's logits to the tokens the constraint allows (sampler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ember {

// Words of a token bitmask: bit (id % 32) of word (id / 32) is 1 when token id is allowed.
inline size_t mask_words(int32_t n_vocab) { return (static_cast<size_t>(n_vocab) + 31) / 32; }
inline bool mask_allows(const uint32_t* mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

// One request's position in its grammar. Used by one thread at a time (the engine loop's).
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Writes the tokens allowed next to mask[mask_words(n_vocab)]. End-of-generation tokens are
  // allowed only where the output so far is a complete sentence of the grammar. An all-zero
  // mask means nothing can follow (the grammar has ended, or the constraint failed: see error).
  virtual void fill_mask(uint32_t* mask) = 0;
  // Advances past `token`, which the last mask allowed. Returns false (and error() says why)
  // when the grammar rejects it.
  virtual bool advance(int32_t token) = 0;
  // The output so far is a complete sentence of the grammar.
  virtual bool is_accepting() = 0;
  virtual std::string error() = 0;
};

// A compiled grammar for one vocabulary. Thread-safe: start() may run on any thread.
class Grammar {
 public:
  virtual ~Grammar() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
  virtual int32_t n_vocab() const = 0;
};

}  // namespace ember
