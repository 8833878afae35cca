// sampling/sampler.cpp: the sampler chain. The stage order follows llama.cpp's default chain, so
// the same parameters narrow the distribution the same way in both engines.
#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ember {

void validate(const SamplingParams& p, int32_t n_vocab) {
  auto fail = [](const char* what, auto got) {
    throw InvalidArgument(cat("[sampling] ", what, ", got ", got));
  };
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) fail("temperature must be >= 0", p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p must be in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("min_p must be in [0, 1]", p.min_p);
  if (!(p.typical_p > 0.0f && p.typical_p <= 1.0f)) fail("typical_p must be in (0, 1]", p.typical_p);
  if (!(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
    fail("repeat_penalty must be > 0", p.repeat_penalty);
  }
  if (p.repeat_last_n < -1) fail("repeat_last_n must be >= -1", p.repeat_last_n);
  if (p.min_tokens < 0) fail("min_tokens must be >= 0", p.min_tokens);
  if (!std::isfinite(p.presence_penalty)) fail("presence_penalty must be finite", p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty)) fail("frequency_penalty must be finite", p.frequency_penalty);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n_vocab) {
      throw InvalidArgument(cat("[sampling] logit_bias: token id ", id, " is outside [0, ", n_vocab, ")"));
    }
    if (std::isnan(bias)) throw InvalidArgument(cat("[sampling] logit_bias: token ", id, " has bias NaN"));
  }
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab, std::unique_ptr<TokenConstraint> constraint,
                 std::vector<int32_t> stop_ids)
    : params_(params),
      n_vocab_(n_vocab),
      rng_(params.seed),
      constraint_(std::move(constraint)),
      stop_ids_(std::move(stop_ids)) {
  if (n_vocab <= 0) throw InvalidArgument(cat("[sampling] n_vocab must be > 0, got ", n_vocab));
  if (constraint_) mask_.assign(mask_words(n_vocab_), 0);
  candidates_.items.reserve(static_cast<size_t>(n_vocab));
  if (penalties_on()) {
    counts_.assign(static_cast<size_t>(n_vocab), 0);
    listed_.assign(static_cast<size_t>(n_vocab), 0);
    if (params_.repeat_last_n > 0) window_.reserve(static_cast<size_t>(params_.repeat_last_n));
  }
}

bool Sampler::penalties_on() const {
  return params_.repeat_last_n != 0 && (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                                        params_.frequency_penalty != 0.0f);
}

void Sampler::accept(int32_t token) {
  if (counts_.empty()) return;
  if (token < 0 || token >= n_vocab_) {
    throw InvalidArgument(cat("[sampling] token id ", token, " is outside [0, ", n_vocab_, ")"));
  }
  const bool bounded = params_.repeat_last_n > 0;
  if (bounded && window_.size() == static_cast<size_t>(params_.repeat_last_n)) {
    int32_t& slot = window_[window_head_];
    --counts_[static_cast<size_t>(slot)];
    slot = token;
    window_head_ = (window_head_ + 1) % window_.size();
  } else {
    window_.push_back(token);
  }
  ++counts_[static_cast<size_t>(token)];
  if (!listed_[static_cast<size_t>(token)]) {
    listed_[static_cast<size_t>(token)] = 1;
    seen_.push_back(token);
  }
  // Drop ids that left the window so `seen_` stays about as small as the window.
  if (seen_.size() > 2 * window_.size() + 16) {
    std::erase_if(seen_, [this](int32_t id) {
      if (counts_[static_cast<size_t>(id)] != 0) return false;
      listed_[static_cast<size_t>(id)] = 0;
      return true;
    });
  }
}

void Sampler::reset() {
  rng_ = Rng(params_.seed);
  for (int32_t id : seen_) {
    counts_[static_cast<size_t>(id)] = 0;
    listed_[static_cast<size_t>(id)] = 0;
  }
  seen_.clear();
  window_.clear();
  window_head_ = 0;
}

void Sampler::narrow(const float* logits) {
  Candidates& c = candidates_;
  c.reset(logits, n_vocab_);
  // Bias and penalties index candidates by id, so they run before anything reorders them.
  apply_logit_bias(c, params_.logit_bias);
  if (!counts_.empty()) {
    apply_penalties(c, counts_.data(), seen_, params_.repeat_penalty, params_.frequency_penalty,
                    params_.presence_penalty);
  }
  // The mask comes after bias and penalties, so no bias can bring back a forbidden token.
  if (constraint_) {
    const uint32_t* mask = mask_.data();
    std::erase_if(c.items, [mask](const TokenCandidate& t) { return !mask_allows(mask, t.id); });
  }
  // min_tokens: no stop token yet, unless the constraint leaves nothing else.
  if (holding_back()) {
    const auto is_stop = [this](const TokenCandidate& t) {
      return std::ranges::find(stop_ids_, t.id) != stop_ids_.end();
    };
    if (!std::ranges::all_of(c.items, is_stop)) std::erase_if(c.items, is_stop);
  }
  if (params_.temperature <= 0.0f) {
    // The mask may have removed candidates, so ids no longer equal positions: find the logit.
    const int32_t best = argmax(c);
    const auto it = std::find_if(c.items.begin(), c.items.end(),
                                 [best](const TokenCandidate& t) { return t.id == best; });
    c.items.assign(1, TokenCandidate{best, it->logit, 1.0f, 0.0f});
    c.sorted = true;
    return;
  }
  top_k(c, params_.top_k);
  typical_p(c, params_.typical_p);
  top_p(c, params_.top_p);
  min_p(c, params_.min_p);
  apply_temperature(c, params_.temperature);
  softmax(c);
}

void Sampler::fill_mask() {
  if (constraint_) constraint_->fill_mask(mask_.data());
}

const Candidates& Sampler::distribution(const float* logits) {
  fill_mask();
  narrow(logits);
  return candidates_;
}

TokenLogprobs Sampler::post_sampling_logprobs(const float* logits, int32_t token, int32_t n_top) {
  const std::vector<TokenCandidate>& items = distribution(logits).items;
  TokenLogprobs out{std::numeric_limits<float>::lowest(), {}};
  std::vector<const TokenCandidate*> kept;  // the candidates with p > 0
  kept.reserve(items.size());
  for (const TokenCandidate& t : items) {
    if (t.id == token && t.p > 0.0f) out.logprob = std::log(t.p);
    if (t.p > 0.0f) kept.push_back(&t);
  }
  const size_t n = std::min(kept.size(), static_cast<size_t>(std::max(n_top, 0)));
  std::partial_sort(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(n), kept.end(),
                    [](const TokenCandidate* a, const TokenCandidate* b) { return a->p > b->p; });
  out.top.reserve(n);
  for (size_t i = 0; i < n; ++i) out.top.emplace_back(kept[i]->id, std::log(kept[i]->p));
  return out;
}

int32_t Sampler::greedy(const float* logits) {
  const float* values = logits;
  if (!params_.logit_bias.empty()) {
    biased_.assign(logits, logits + n_vocab_);
    for (const auto& [id, delta] : params_.logit_bias) biased_[static_cast<size_t>(id)] += delta;
    values = biased_.data();
  }
  // argmax(): the first id of the largest value (later equal values never replace it).
  if (!constraint_) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab_; ++i) {
      if (values[i] > values[best]) best = i;
    }
    return best;
  }
  // Over the allowed ids only, a 32-token word at a time (the mask is never empty).
  int32_t best = -1;
  const size_t n_words = mask_.size();
  for (size_t w = 0; w < n_words; ++w) {
    for (uint32_t bits = mask_[w]; bits != 0; bits &= bits - 1) {
      const int32_t i = static_cast<int32_t>(w * 32) + std::countr_zero(bits);
      if (i < n_vocab_ && (best < 0 || values[i] > values[best])) best = i;
    }
  }
  return best < 0 ? 0 : best;
}

int32_t Sampler::sample(const float* logits) {
  fill_mask();
  if (params_.temperature <= 0.0f && counts_.empty() && !holding_back()) return greedy(logits);
  narrow(logits);
  const std::vector<TokenCandidate>& items = candidates_.items;
  if (items.size() == 1) return items.front().id;
  // Inverse CDF; probabilities sum to 1 up to rounding, so the last candidate catches the rest.
  const double u = rng_.uniform();
  double cumulative = 0.0;
  for (const TokenCandidate& t : items) {
    cumulative += t.p;
    if (u < cumulative) return t.id;
  }
  return items.back().id;
}

int32_t Sampler::verify(const float* logits, int32_t draft) {
  if (params_.temperature <= 0.0f) return sample(logits);
  fill_mask();  // a constrained request's draft outside the grammar has p = 0
  narrow(logits);
  const std::vector<TokenCandidate>& items = candidates_.items;
  double p_draft = 0.0;
  for (const TokenCandidate& t : items) {
    if (t.id == draft) p_draft = t.p;
  }
  if (rng_.uniform() < p_draft) return draft;
  // Rejected (so p_draft < 1): draw from p with the draft's share taken out, renormalized.
  double rest = 0.0;
  for (const TokenCandidate& t : items) rest += t.id == draft ? 0.0 : t.p;
  const double u = rng_.uniform() * rest;
  double cumulative = 0.0;
  int32_t last = items.front().id;
  for (const TokenCandidate& t : items) {
    if (t.id == draft) continue;
    last = t.id;
    cumulative += t.p;
    if (u < cumulative) return t.id;
  }
  return last;
}

}  // namespace ember
