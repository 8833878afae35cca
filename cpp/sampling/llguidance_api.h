// sampling/llguidance_api.h: the part of llguidance's C ABI that ember calls (version 1.8.0,
// as declared in its llguidance.h; llguidance is MIT-licensed, (c) Microsoft Corporation).
// ember does not link llguidance: it opens the shared library the `llguidance` Python package
// ships at run time (llguidance.cpp), so these are only layouts and function types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::llg {

inline constexpr const char* kVersion = "1.8.0";  // the ABI below; llguidance.cpp checks it
// llg_get_version() says "llguidance@1.8.0 derivre@..." (its crates' versions).
inline constexpr const char* kVersionTag = "llguidance@1.8.0 ";

struct Tokenizer;  // LlgTokenizer
struct Matcher;    // LlgMatcher

using TokenizeFn = size_t (*)(const void* user_data, const uint8_t* bytes, size_t n_bytes, uint32_t* out,
                              size_t n_out);

struct ParserLimits {  // LlgParserLimits: 0 fields take llguidance's defaults
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

struct ConstraintInit {  // LlgConstraintInit
  const Tokenizer* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  ParserLimits limits;
};

struct TokenizerInitV2 {  // LlgTokenizerInitV2
  size_t struct_size;     // sizeof(TokenizerInitV2)
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;  // [vocab_size]
  const uint8_t* token_bytes;  // every token's bytes, one after the other
  const char* tokenizer_json;
  bool tokenize_assumes_string;
  TokenizeFn tokenize_fn;
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;
  const uint32_t* tok_eos_extra;  // [tok_eos_extra_count]
  uint32_t tok_eos_extra_count;
};

// The functions, by their C names.
struct Api {
  const char* (*get_version)();
  Tokenizer* (*new_tokenizer_v2)(const TokenizerInitV2*, char* error, size_t error_len);
  void (*free_tokenizer)(Tokenizer*);
  void (*constraint_init_set_defaults)(ConstraintInit*, const Tokenizer*);
  Matcher* (*new_matcher)(const ConstraintInit*, const char* constraint_type, const char* data);
  Matcher* (*clone_matcher)(const Matcher*);
  void (*free_matcher)(Matcher*);
  const char* (*matcher_get_error)(Matcher*);
  int32_t (*matcher_compute_mask_into)(Matcher*, uint32_t* mask, size_t mask_bytes);
  int32_t (*matcher_consume_token)(Matcher*, uint32_t token);
  bool (*matcher_is_accepting)(Matcher*);
};

}  // namespace ember::llg
