// sampling/candidates.h: the tokens still in the running while a sampler narrows one step's
// logits down, and the stages that narrow them. Every stage works in place on a Candidates set
// and never allocates; stages that need probabilities compute them from the current logits.
#pragma once

#include <cstdint>
#include <vector>

namespace ember {

struct TokenCandidate {
  int32_t id;
  float logit;
  float p;    // valid after softmax(); stale otherwise
  float key;  // scratch for stages that order by something else than the logit
};

struct Candidates {
  std::vector<TokenCandidate> items;  // [size], capacity n_vocab; reused from step to step
  bool sorted = false;                // items are in descending logit order

  // Fills items with (i, logits[i]) for every i in [0, n_vocab): ids equal positions until
  // a stage reorders them.
  void reset(const float* logits, int32_t n_vocab);
  int32_t size() const { return static_cast<int32_t>(items.size()); }
};

// p_i = exp(l_i - max) / sum_j exp(l_j - max), over the current candidates.
void softmax(Candidates& c);

// Index of the largest logit (the lowest id among equals).
int32_t argmax(const Candidates& c);

// The stages, in the order Sampler runs them. Each keeps at least one candidate.

// logit[id] += bias. Needs ids == positions (run before anything reorders).
void apply_logit_bias(Candidates& c, const std::vector<std::pair<int32_t, float>>& bias);

// For each token with count > 0 in the penalty window (counts indexed by id, the distinct ids
// listed in `seen`): logit = logit > 0 ? logit / repeat : logit * repeat, then
// logit -= count * frequency + presence. Needs ids == positions.
void apply_penalties(Candidates& c, const int32_t* counts, const std::vector<int32_t>& seen, float repeat,
                     float frequency, float presence);

// Keeps the k highest logits, sorted.
void top_k(Candidates& c, int32_t k);

// Locally typical sampling (Meister et al. 2022): with entropy H = -sum p log p, keeps the
// tokens whose surprise -log p is closest to H until their probabilities sum to >= typical_p.
void typical_p(Candidates& c, float typical_p);

// Nucleus: keeps the most probable tokens until their probabilities sum to >= p.
void top_p(Candidates& c, float p);

// Keeps tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
void min_p(Candidates& c, float min_p);

// logit /= temperature (temperature > 0).
void apply_temperature(Candidates& c, float temperature);

}  // namespace ember
