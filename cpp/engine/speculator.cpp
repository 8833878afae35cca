// engine/speculator.cpp: which requests draft, from what, and how deep.
#include "engine/speculator.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/scheduler.h"

namespace ember {

std::string_view to_string(DraftSource source) {
  switch (source) {
    case DraftSource::none: return "none";
    case DraftSource::ngram: return "ngram";
    case DraftSource::prediction: return "prediction";
    case DraftSource::draft_model: return "draft_model";
  }
  return "?";
}

void StepCostModel::add(int64_t n_rows, double seconds) {
  const double n = static_cast<double>(n_rows);
  s0_ = s0_ * kDecay + 1;
  sn_ = sn_ * kDecay + n;
  st_ = st_ * kDecay + seconds;
  snn_ = snn_ * kDecay + n * n;
  snt_ = snt_ * kDecay + n * seconds;
  ++n_;
  const double mean_n = sn_ / s0_, mean_t = st_ / s0_;
  const double var_n = snn_ / s0_ - mean_n * mean_n;
  double b = mean_t / (mean_n + kPriorRows);
  if (var_n > 1.0) b = std::clamp((snt_ / s0_ - mean_n * mean_t) / var_n, 0.0, mean_t / mean_n);
  per_row_s_ = b;
  fixed_s_ = std::max(0.0, mean_t - b * mean_n);
}

double Speculator::RequestState::acceptance() const {
  // A prediction is the caller's own guess of the output: start out trusting it more.
  const double prior_accepted = source == DraftSource::prediction ? 4.0 : 1.0, prior_rejected = 1.0;
  const double alpha = (accepted + prior_accepted) / (accepted + rejected + prior_accepted + prior_rejected);
  return std::clamp(alpha, 0.02, 0.98);
}

Speculator::Speculator(const SpeculationConfig& config, std::unique_ptr<DraftModel> draft_model)
    : config_(config), draft_model_(std::move(draft_model)) {
  if (config.source == DraftSource::prediction) {
    throw InvalidArgument(
        "[speculation] 'prediction' drafts come from requests, not from the engine's source");
  }
  if (config.source == DraftSource::draft_model && !draft_model_) {
    throw InvalidArgument("[speculation] the draft_model source needs a draft model");
  }
  if (config.draft_max < 1 || config.draft_min < 0 || config.draft_min > config.draft_max) {
    throw InvalidArgument(
        cat("[speculation] need 1 <= draft_max and 0 <= draft_min <= draft_max, got draft_max ",
            config.draft_max, ", draft_min ", config.draft_min));
  }
  if (config.ngram_min < 1 || config.ngram_max < config.ngram_min) {
    throw InvalidArgument(cat("[speculation] need 1 <= ngram_min <= ngram_max, got ", config.ngram_min,
                              " and ", config.ngram_max));
  }
}

Speculator::RequestState& Speculator::state_of(const Request& r) {
  auto it = states_.find(r.id);
  if (it != states_.end()) return it->second;
  RequestState s;
  if (!r.options.prediction.empty()) {
    s.source = DraftSource::prediction;
    s.prediction = PredictionCursor(r.options.prediction);
  } else {
    s.source = config_.source;
  }
  return states_.emplace(r.id, std::move(s)).first->second;
}

// Depth per candidate, best drafts first while each raises expected tokens per second (see the
// top of speculator.h).
std::vector<int64_t> Speculator::depths(std::span<const double> acceptance,
                                        std::span<const int64_t> max_depth, int64_t n_plain_rows,
                                        int64_t n_samples, int64_t budget) const {
  std::vector<int64_t> depth(max_depth.size(), 0);
  if (!config_.adaptive || !cost_.known()) {
    int64_t rows = n_plain_rows;
    for (size_t i = 0; i < depth.size(); ++i) {
      depth[i] = std::clamp<int64_t>(budget - rows, 0, max_depth[i]);
      rows += depth[i];
    }
    return depth;
  }
  struct Offer {
    double value;  // expected tokens the draft adds: acceptance^(j + 1)
    size_t request;
    int64_t j;
  };
  std::vector<Offer> offers;
  for (size_t i = 0; i < max_depth.size(); ++i) {
    double value = 1.0;
    for (int64_t j = 0; j < max_depth[i]; ++j) offers.push_back({value *= acceptance[i], i, j});
  }
  // Within a request values fall with j, so taking offers in this order hands out prefixes.
  std::ranges::sort(offers, [](const Offer& x, const Offer& y) {
    return x.value != y.value ? x.value > y.value : x.j < y.j;
  });
  const double b = cost_.per_row_s();
  double time = cost_.fixed_s() + b * static_cast<double>(n_plain_rows);
  double tokens = static_cast<double>(std::max<int64_t>(1, n_samples));
  int64_t rows = n_plain_rows;
  for (const Offer& o : offers) {
    if (rows + 1 > budget || o.value * time <= b * tokens) break;
    ++depth[o.request];
    time += b;
    tokens += o.value;
    ++rows;
  }
  return depth;
}

void Speculator::propose(Scheduler& scheduler) {
  const int64_t budget = scheduler.config().max_num_batched_tokens;
  int64_t n_plain_rows = 0, n_samples = 0;
  std::vector<const Request*> candidates;
  std::vector<std::vector<int32_t>> drafts;
  std::vector<double> acceptance;
  std::vector<int64_t> max_depth;
  for (const Request* r : scheduler.running()) {
    const int64_t n_remaining = r->n_tokens() - r->num_computed_tokens;
    n_plain_rows += n_remaining;
    if (n_remaining != 1) continue;
    ++n_samples;
    RequestState& s = state_of(*r);
    if (s.source == DraftSource::none) continue;
    const int64_t n_max = std::min<int64_t>(config_.draft_max, scheduler.max_drafts(*r));
    if (n_max < 1) continue;
    std::vector<int32_t> d;
    if (s.source == DraftSource::ngram) {
      d = ngram_drafts(r->token_ids, config_.ngram_min, config_.ngram_max, n_max);
    } else if (s.source == DraftSource::prediction) {
      d = s.prediction.drafts(r->output_token_ids(), n_max);
    }
    const int64_t n_avail = s.source == DraftSource::draft_model ? n_max : static_cast<int64_t>(d.size());
    if (n_avail < std::max(1, config_.draft_min)) continue;
    candidates.push_back(r);
    drafts.push_back(std::move(d));
    acceptance.push_back(s.acceptance());
    max_depth.push_back(n_avail);
  }
  if (candidates.empty()) return;
  n_plain_rows = std::min(n_plain_rows, budget);
  const std::vector<int64_t> depth = depths(acceptance, max_depth, n_plain_rows, n_samples, budget);

  std::vector<DraftModel::Query> queries;
  std::vector<size_t> query_of;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (depth[i] < std::max(1, config_.draft_min)) continue;
    if (states_.at(candidates[i]->id).source == DraftSource::draft_model) {
      queries.push_back({candidates[i]->id, candidates[i]->token_ids, depth[i], {}});
      query_of.push_back(i);
    }
  }
  if (!queries.empty()) {
    draft_model_->propose(queries);
    for (size_t q = 0; q < queries.size(); ++q) drafts[query_of[q]] = std::move(queries[q].drafts);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (depth[i] < std::max(1, config_.draft_min)) continue;
    std::vector<int32_t>& d = drafts[i];
    d.resize(std::min<size_t>(d.size(), static_cast<size_t>(depth[i])));
    if (static_cast<int64_t>(d.size()) >= std::max(1, config_.draft_min))
      scheduler.set_drafts(candidates[i]->id, std::move(d));
  }
}

void Speculator::observe(const StepPlan& plan, std::span<const SampledTokens> sampled, double seconds) {
  if (plan.n_tokens > 0) cost_.add(plan.n_tokens, seconds);
  size_t k = 0;
  for (const ScheduledSequence& p : plan.seqs) {
    if (!p.needs_sample) continue;
    const SampledTokens& got = sampled[k++];
    if (p.n_drafts() == 0) continue;
    const auto it = states_.find(p.id);
    if (it == states_.end()) continue;
    RequestState& s = it->second;
    constexpr double kForget = 0.9;  // recent verifications weigh most
    s.accepted = s.accepted * kForget + static_cast<double>(got.n_accepted());
    s.rejected = s.rejected * kForget + (got.n_accepted() < p.n_drafts() ? 1.0 : 0.0);
    const int source = static_cast<int>(s.source);
    stats_.n_drafted[source] += p.n_drafts();
    stats_.n_accepted[source] += got.n_accepted();
  }
}

void Speculator::release(std::span<const RequestId> ids) {
  for (RequestId id : ids) states_.erase(id);
  if (draft_model_) draft_model_->release(ids);
}

}  // namespace ember
