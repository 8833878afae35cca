// engine/draft_model.h: the draft-model source of speculation — a small model with the target's
// vocabulary guessing requests' next tokens greedily, over a paged KV cache of its own (its own
// block tables and pool, no prefix caching). Batches every request's catch-up rows and then a
// pass per guess (or per run of guesses that prompt lookup foresaw: staged drafting, see
// DraftModelConfig::lookahead), reporting each guess's probability under the draft (the Query's
// judge decides from it where a request's guesses end).
// Engine thread only; knows nothing of the scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/speculator.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "model/run_state.h"

namespace ember {

struct DraftModelConfig {
  int64_t n_blocks = 0;  // KV blocks of the draft's own cache
  int64_t n_ctx = 0;  // tokens one sequence may reach (the target's max_model_len): picks LongRoPE's factors
  int block_size = EngineOptions{}.block_size;
  int64_t max_batch_rows = EngineOptions{}.max_batch_tokens;  // rows of one draft forward pass at
                                                              // most (catch-up is chunked)
  // Leading tokens every guess scores (see above): -1 chooses (draft_vocab_rows), 0 all of them,
  // else a multiple of kVocabRowsAlign.
  int64_t vocab_rows = -1;
  // Staged drafting: a pass that feeds a request's last token also feeds up to this many tokens
  // that prompt lookup (n-grams of 2 to 4 tokens) expects after it, and keeps the draft's guesses
  // for as long as they are those tokens. The guesses are the ones a pass per guess would make
  // (each row sees the tokens before it), in fewer passes where the text repeats. 0: one guess a
  // pass.
  int64_t lookahead = 8;
};

// The leading tokens a draft model with a vocabulary of n_vocab scores for every guess: all of a
// small vocabulary (under 32768), else a quarter of it and at least 16384 (rounded up to
// kVocabRowsAlign).
int64_t draft_vocab_rows(int64_t n_vocab);

// Throws InvalidArgument when `draft` cannot draft for `target`: another vocabulary size, or
// token texts that differ (the GGUF's tokenizer.ggml.tokens).
void check_same_vocabulary(const Model& target, const Model& draft);

class ModelDrafter : public DraftModel {
 public:
  ModelDrafter(std::shared_ptr<const Model> draft, const DraftModelConfig& config);

  void propose(std::span<Query> queries) override;
  void release(std::span<const RequestId> ids) override;
  const StepCostModel& cost() const override { return cost_; }

  const Model& model() const { return *model_; }
  int64_t n_passes() const { return n_passes_; }  // forward passes run so far

 private:
  struct SequenceDraft {
    int64_t n_computed = 0;            // leading tokens of the request whose draft K/V is valid
    std::vector<int32_t> speculative;  // guesses whose K/V follows n_computed (valid if they come true)
    // Its text's distinct tokens at or past vocab_rows_ (of its first n_scanned tokens; the first
    // kMaxRare of them), and their output-head rows as f32 [rare.size(), n_embd].
    int64_t n_scanned = 0;
    std::vector<int32_t> rare;
    std::vector<float> rare_rows;
  };
  static constexpr size_t kMaxRare = 1024;  // (8 MB a request at n_embd 2048)
  // Adds the rare tokens of tokens[s.n_scanned ..] to s.
  void scan_rare(SequenceDraft& s, std::span<const int32_t> tokens) const;
  // Runs rows[i] — query `query`'s tokens[0, count) at positions start .. start + count - 1 —
  // through the draft, writing their K/V; the last n_logits rows of each give guesses (argmax),
  // appended to `guesses` in row order with the draft's probability of each.
  struct Rows {
    size_t query;
    int64_t start, count;
    const int32_t* tokens;
    int64_t n_logits;
  };
  struct Guess {
    int32_t token;
    float probability;
  };
  void run(std::span<const Rows> rows, std::span<Query> queries, std::vector<Guess>& guesses);
  // The guess of one row of logits (the first vocab_rows_ tokens), with request s's rare tokens
  // scored against the row's final state `hidden` where s is given.
  Guess guess(const float* logits, const float* hidden, const SequenceDraft* s);

  std::shared_ptr<const Model> model_;
  DraftModelConfig config_;
  KVCacheManager kv_;
  PagedKVCache cache_;
  Scratch scratch_;
  std::unordered_map<RequestId, SequenceDraft> seqs_;
  StepCostModel cost_;  // of run() while drafting: seconds by rows
  int64_t n_passes_ = 0;
  // Reused every call.
  std::vector<int32_t> tokens_, positions_, output_rows_;
  std::vector<SequenceRows> seq_rows_;
  std::vector<float> logits_, hidden_, rare_logits_;
  int64_t vocab_rows_ = 0;         // tokens every guess scores; n_vocab: all
  const uint8_t* head_ = nullptr;  // the output head's rows as in the file (for the rare tokens)
  DType head_type_ = DType::f32;
};

}  // namespace ember
