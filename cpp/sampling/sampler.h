// sampling/sampler.h: one request's sampler — its parameters, its own random generator and the
// window of recent tokens the penalties look at. Turns a row of logits into the next token.
// Owns no model state; a request's tokens reach it through accept(). A constrained request's
// sampler also owns its TokenConstraint: every step's logits are masked to the tokens it allows
// (after logit bias and penalties, before everything else), whatever the sampling mode.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sampling/candidates.h"
#include "sampling/constraint.h"
#include "sampling/logprobs.h"
#include "sampling/params.h"
#include "sampling/rng.h"

namespace ember {

class Sampler {
 public:
  // `params` come validated (validate() runs once, where the request arrives: Engine::submit);
  // throws InvalidArgument for n_vocab <= 0. stop_ids: the request's stop tokens, held back
  // until params.min_tokens outputs have been advanced past.
  Sampler(const SamplingParams& params, int32_t n_vocab,
          std::unique_ptr<TokenConstraint> constraint = nullptr, std::vector<int32_t> stop_ids = {});

  // Picks the next token from logits[n_vocab] (not modified). The chain: logit bias, penalties,
  // then greedy when temperature <= 0, else top_k, typical_p, top_p, min_p, temperature and a
  // draw from what is left. Does not accept the token: call accept() with it.
  int32_t sample(const float* logits);

  // Verifies a speculative draft token against logits[n_vocab], the row that predicts it, and
  // returns the draft when it is accepted, else the token to emit instead. The draft is a fixed
  // guess (one-hot q: n-gram lookup, a prediction, a greedy draft model), so the standard rule
  // (accept with min(1, p/q), else draw from (p - q)+) reads: accept with probability p(draft)
  // under the distribution sample() would draw from, else draw from that distribution with the
  // draft removed. Either way the result is distributed exactly as sample()'s. Greedy: the
  // argmax (it equals the draft iff the draft is accepted). Does not accept the token.
  int32_t verify(const float* logits, int32_t draft);

  // The distribution sample() would draw from: the surviving candidates with their final
  // probabilities (one candidate with p = 1 when greedy). For tests and for explaining choices.
  const Candidates& distribution(const float* logits);

  // The log-probability of `token` under distribution(logits), and the (at most) n_top most
  // likely tokens of it with theirs, most likely first (llama-server's post_sampling_probs).
  // A token the chain removed has the lowest float, not -inf (JSON cannot carry it). Call it
  // before advance(token): it masks with the constraint's current state.
  TokenLogprobs post_sampling_logprobs(const float* logits, int32_t token, int32_t n_top);

  // Adds a token (prompt or generated) to the penalty window.
  void accept(int32_t token);

  // The token sample() returned became the request's next output: advances the constraint.
  // Returns false when the constraint rejects it (never for a token sample() picked).
  bool advance(int32_t token) {
    ++n_output_;
    return !constraint_ || constraint_->advance(token);
  }
  TokenConstraint* constraint() { return constraint_.get(); }

  // Empties the penalty window and reseeds the generator.
  void reset();

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

 private:
  void narrow(const float* logits);  // fills candidates_ with the final distribution
  void fill_mask();                  // mask_ for this step, when constrained
  bool penalties_on() const;
  bool holding_back() const { return n_output_ < params_.min_tokens && !stop_ids_.empty(); }
  // Greedy sampling without penalties: argmax of the biased (and masked) logits, as narrow()
  // would pick it, without building n_vocab candidates.
  int32_t greedy(const float* logits);

  SamplingParams params_;
  int32_t n_vocab_;
  Rng rng_;
  Candidates candidates_;                        // reused every step
  std::vector<float> biased_;                    // [n_vocab] greedy(): the logits plus the logit bias
  std::unique_ptr<TokenConstraint> constraint_;  // null: unconstrained
  std::vector<uint32_t> mask_;                   // [mask_words(n_vocab)] this step's allowed tokens
  std::vector<int32_t> window_;                  // ring of the last repeat_last_n tokens (all of them for -1)
  size_t window_head_ = 0;                       // next slot to overwrite once the ring is full
  std::vector<int32_t> counts_;    // [n_vocab]: occurrences in the window; empty when no penalties
  std::vector<uint8_t> listed_;    // [n_vocab]: 1 when the id is in seen_
  std::vector<int32_t> seen_;      // distinct ids, a superset of those with counts_ > 0
  std::vector<int32_t> stop_ids_;  // what min_tokens holds back
  int64_t n_output_ = 0;           // tokens advance() has seen
};

}  // namespace ember
