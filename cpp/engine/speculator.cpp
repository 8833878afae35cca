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
  // A step's fixed cost is taken to be at least one row's: with steps of a few rows and
  // millisecond noise (a small model), the fit can otherwise put all of the time in the rows, and
  // then no draft ever pays.
  if (var_n > 1.0) b = std::clamp((snt_ / s0_ - mean_n * mean_t) / var_n, 0.0, mean_t / (mean_n + 1.0));
  per_row_s_ = b;
  fixed_s_ = std::max(0.0, mean_t - b * mean_n);
}

namespace {

// The bin of an agreement run of m tokens: 0, 1, 2-3, 4-7, 8-15, 16 and more.
int run_bin(int64_t m, int n_bins) {
  int bin = 0;
  for (; m > 0 && bin < n_bins - 1; m >>= 1) ++bin;
  return bin;
}

// A draft model's bins by its probability of the draft, and the middle of each.
constexpr std::array<float, 5> kProbabilityEdges = {0.3f, 0.5f, 0.7f, 0.85f, 0.95f};
constexpr std::array<double, 6> kProbabilityMiddles = {0.15, 0.4, 0.6, 0.78, 0.9, 0.975};

int probability_bin(float p) {
  return static_cast<int>(std::ranges::upper_bound(kProbabilityEdges, p) - kProbabilityEdges.begin());
}

}  // namespace

double Speculator::Evidence::keep_chance(int bin) const {
  static_assert(kProbabilityMiddles.size() == kBins);
  // Before any evidence: even odds for prompt lookup; for a draft model, the draft's own
  // probability (the bin's middle, worth two drafts of evidence); a prediction is the caller's
  // own guess of the output, so there the longer the output has followed it, the likelier its
  // next token (runs of 0 and 1 token: 1/2, 2-3: 2/3, ... 16 and more: 5/6).
  double prior_kept = 1.0, prior_rejected = 1.0;
  if (source == DraftSource::prediction) prior_kept = std::max(1, bin);
  if (source == DraftSource::draft_model) {
    prior_kept = 2.0 * kProbabilityMiddles[bin];
    prior_rejected = 2.0 - prior_kept;
  }
  const double p = (kept[bin] + prior_kept) / (kept[bin] + rejected[bin] + prior_kept + prior_rejected);
  return std::clamp(p, 0.02, 0.98);
}

double Speculator::Evidence::mean_keep_chance() const {
  double n_kept = 0, n_rejected = 0;
  for (int bin = 0; bin < kBins; ++bin) {
    n_kept += kept[bin];
    n_rejected += rejected[bin];
  }
  return std::clamp((n_kept + 3.0) / (n_kept + n_rejected + 4.0), 0.02, 0.98);  // prior: 3/4
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
  s.own.source = s.source;
  RequestState& added = states_.emplace(r.id, std::move(s)).first->second;
  added.evidence = added.source == DraftSource::draft_model ? &draft_evidence_ : &added.own;
  return added;
}

// Depth per candidate, best drafts first while each raises expected tokens per second (see the
// top of speculator.h).
std::vector<int64_t> Speculator::depths(std::span<Candidate> candidates, int64_t n_plain_rows,
                                        int64_t n_samples, int64_t budget) const {
  std::vector<int64_t> depth(candidates.size(), 0);
  if (!config_.adaptive || !cost_.known()) {  // (known after the engine's first decode step)
    int64_t rows = n_plain_rows;
    for (size_t i = 0; i < depth.size(); ++i) {
      depth[i] = std::clamp<int64_t>(budget - rows, 0, static_cast<int64_t>(candidates[i].value.size()));
      candidates[i].min_value.assign(static_cast<size_t>(depth[i]), 0.0);
      candidates[i].min_kept_value.assign(static_cast<size_t>(depth[i]), 0.0);
      rows += depth[i];
    }
    return depth;
  }
  struct Offer {
    double value;  // v_j
    size_t candidate;
    int64_t j;
  };
  std::vector<Offer> offers;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::vector<double>& v = candidates[i].value;
    for (size_t j = 0; j < v.size(); ++j) offers.push_back({v[j], i, static_cast<int64_t>(j)});
  }
  // Within a request values fall with j, so taking offers in this order hands out prefixes.
  std::ranges::sort(offers, [](const Offer& x, const Offer& y) {
    return x.value != y.value ? x.value > y.value : x.j < y.j;
  });
  const double b = cost_.per_row_s();
  const bool drafter_known = draft_model_ && draft_model_->cost().known();
  const double draft_fixed_s = drafter_known ? draft_model_->cost().fixed_s() : 0.0;
  const double draft_row_s = drafter_known ? draft_model_->cost().per_row_s() : 0.0;
  double time = cost_.fixed_s() + b * static_cast<double>(n_plain_rows);
  double tokens = static_cast<double>(std::max<int64_t>(1, n_samples));
  int64_t rows = n_plain_rows, draft_passes = 0;
  std::vector<bool> closed(candidates.size(), false);  // an offer of it was refused: so are the rest
  for (const Offer& o : offers) {
    if (rows + 1 > budget) break;
    if (closed[o.candidate]) continue;
    double cost = b;
    const bool from_draft_model = candidates[o.candidate].state->source == DraftSource::draft_model;
    if (from_draft_model) cost += draft_row_s + (o.j >= draft_passes ? draft_fixed_s : 0.0);
    if (o.value * time <= cost * tokens) {
      closed[o.candidate] = true;
      continue;
    }
    ++depth[o.candidate];
    candidates[o.candidate].min_value.push_back(cost * tokens / time);
    candidates[o.candidate].min_kept_value.push_back(b * tokens / time);
    if (from_draft_model) draft_passes = std::max(draft_passes, o.j + 1);
    time += cost;
    tokens += o.value;
    ++rows;
  }
  return depth;
}

void Speculator::probe(std::span<Candidate> candidates, std::span<int64_t> depth, int64_t n_plain_rows,
                       int64_t budget) {
  const int64_t min_drafts = std::max(1, config_.draft_min);
  int64_t rows = n_plain_rows;
  size_t best = candidates.size();
  bool drafted = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    rows += depth[i];
    if (candidates[i].state->source != DraftSource::draft_model) continue;
    drafted = drafted || depth[i] >= min_drafts;
    if (best == candidates.size() || candidates[i].value[0] > candidates[best].value[0]) best = i;
  }
  if (best == candidates.size()) return;
  if (drafted) {
    undrafted_steps_ = 0;
    probe_after_ = kFirstProbe;
    return;
  }
  if (++undrafted_steps_ < probe_after_) return;
  undrafted_steps_ = 0;
  probe_after_ = std::min(2 * probe_after_, kLastProbe);
  depth[best] = std::min({kProbeDepth, static_cast<int64_t>(candidates[best].value.size()), budget - rows});
  candidates[best].min_value.assign(static_cast<size_t>(std::max<int64_t>(0, depth[best])), 0.0);
  candidates[best].min_kept_value = candidates[best].min_value;
}

void Speculator::propose(Scheduler& scheduler) {
  const int64_t budget = scheduler.config().max_batch_tokens;
  const int64_t min_drafts = std::max(1, config_.draft_min);
  int64_t n_plain_rows = 0, n_samples = 0;
  std::vector<Candidate> candidates;
  for (const Request* r : scheduler.running()) {
    const int64_t n_remaining = r->n_tokens() - r->num_computed_tokens;
    n_plain_rows += n_remaining;
    if (n_remaining != 1) continue;
    ++n_samples;
    RequestState& s = state_of(*r);
    if (s.source == DraftSource::none) continue;
    const int64_t n_max = std::min<int64_t>(config_.draft_max, scheduler.max_drafts(*r));
    if (n_max < 1) continue;
    Candidate c{r, &s, {}, {}, {}, {}};
    int64_t run = 0;
    if (s.source == DraftSource::ngram) {
      c.drafts = ngram_drafts(r->token_ids, config_.ngram_min, config_.ngram_max, n_max);
    } else if (s.source == DraftSource::prediction) {
      c.drafts = s.prediction.drafts(r->output_token_ids(), n_max);
      run = s.prediction.n_matched();
      // Lost (no suffix of the output is in the prediction): what the output writes now may still
      // be in its own text (the prompt quotes the prediction's source; a new function repeats
      // an earlier one's lines), so prompt lookup drafts, priced as a realignment on a match of
      // its length.
      if (c.drafts.empty()) {
        c.drafts = ngram_drafts(r->token_ids, config_.ngram_min, config_.ngram_max, n_max, &run);
      }
    }
    const int64_t n_avail = s.source == DraftSource::draft_model ? n_max
                                                                 : static_cast<int64_t>(c.drafts.size());
    if (n_avail < min_drafts) continue;
    s.run_at_draft = run;
    // Draft j is kept only if every draft before it is, each extending the run.
    const Evidence& e = *s.evidence;
    const double p_any = s.source == DraftSource::draft_model ? e.mean_keep_chance() : e.keep_chance(0);
    const bool by_run = s.source == DraftSource::prediction;
    double value = 1.0;
    for (int64_t j = 0; j < n_avail; ++j) {
      c.value.push_back(value *= by_run ? e.keep_chance(run_bin(run + j, kBins)) : p_any);
    }
    candidates.push_back(std::move(c));
  }
  if (candidates.empty()) return;
  n_plain_rows = std::min(n_plain_rows, budget);
  std::vector<int64_t> depth = depths(candidates, n_plain_rows, n_samples, budget);
  if (config_.adaptive && cost_.known() && draft_model_) probe(candidates, depth, n_plain_rows, budget);

  std::vector<DraftModel::Query> queries;
  std::vector<size_t> query_of;
  const double p_next = draft_evidence_.mean_keep_chance();  // a guess not yet made
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (depth[i] < min_drafts || candidates[i].state->source != DraftSource::draft_model) continue;
    // Guess j is kept while v_j, from the bins of the guesses so far, pays for its target row,
    // and a next one drafted while its expected value pays for all it costs (see the top of
    // speculator.h).
    auto judge = [&e = draft_evidence_, &c = candidates[i], p_next, v = 1.0, j = size_t{0}](float p) mutable {
      v *= e.keep_chance(probability_bin(p));
      const size_t at = j++;
      const bool keep = at < c.min_kept_value.size() && v > c.min_kept_value[at];
      const bool more = keep && at + 1 < c.min_value.size() && v * p_next > c.min_value[at + 1];
      return DraftModel::Query::Verdict{keep, more};
    };
    queries.push_back({candidates[i].request->id, candidates[i].request->token_ids, depth[i], judge, {}, {}});
    query_of.push_back(i);
  }
  if (!queries.empty()) {
    draft_model_->propose(queries);
    for (size_t q = 0; q < queries.size(); ++q) {
      Candidate& c = candidates[query_of[q]];
      c.drafts = std::move(queries[q].drafts);
      c.state->probability = std::move(queries[q].probabilities);
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (depth[i] < min_drafts) {
      // Not drafted although it could have been: its evidence fades toward the prior, so a few
      // early rejections do not stop a request from speculating for good (nothing else would
      // ever bring new evidence; for a draft model, whose evidence is shared, the probes do).
      Evidence& e = candidates[i].state->own;
      for (int bin = 0; bin < kBins; ++bin) {
        e.kept[bin] *= kUndraftedForget;
        e.rejected[bin] *= kUndraftedForget;
      }
      continue;
    }
    std::vector<int32_t>& d = candidates[i].drafts;
    d.resize(std::min<size_t>(d.size(), static_cast<size_t>(depth[i])));
    if (static_cast<int64_t>(d.size()) >= min_drafts)
      scheduler.set_drafts(candidates[i].request->id, std::move(d));
  }
}

void Speculator::observe(const StepPlan& plan, std::span<const SampledTokens> sampled, double seconds) {
  // Only steps of decoding rows price a draft row: a prompt chunk's rows (a GEMM, with less
  // attention each) cost far less apiece, and one long prompt would outweigh every decode step
  // in the fit for long after.
  const bool decoding = std::ranges::all_of(
      plan.seqs, [](const ScheduledSequence& p) { return p.needs_sample && p.n_tokens == 1 + p.n_drafts(); });
  if (plan.n_tokens > 0 && decoding) cost_.add(plan.n_tokens, seconds);
  size_t k = 0;
  for (const ScheduledSequence& p : plan.seqs) {
    if (!p.needs_sample) continue;
    const SampledTokens& got = sampled[k++];
    if (p.n_drafts() == 0) continue;
    const auto it = states_.find(p.id);
    if (it == states_.end()) continue;
    RequestState& s = it->second;
    // Each bin a verification's drafts fall in forgets a little first (the recent verifications
    // weigh most); bins it does not reach keep their evidence.
    constexpr double kForget = 0.9;
    std::array<bool, kBins> forgot{};
    for (int64_t j = 0; j <= std::min(got.n_accepted(), p.n_drafts() - 1); ++j) {
      int bin = 0;
      if (s.source == DraftSource::prediction) bin = run_bin(s.run_at_draft + j, kBins);
      if (s.source == DraftSource::draft_model && j < std::ssize(s.probability)) {
        bin = probability_bin(s.probability[static_cast<size_t>(j)]);
      }
      Evidence& e = *s.evidence;
      if (!forgot[bin]) {
        e.kept[bin] *= kForget;
        e.rejected[bin] *= kForget;
        forgot[bin] = true;
      }
      (j < got.n_accepted() ? e.kept : e.rejected)[bin] += 1.0;
    }
    const int source = static_cast<int>(s.source);
    stats_.n_drafted[source] += p.n_drafts();
    stats_.n_accepted[source] += got.n_accepted();
  }
}

void Speculator::catch_up(const StepPlan& plan, const Scheduler& scheduler) {
  if (!draft_model_) return;
  std::vector<DraftModel::Query> queries;
  for (const ScheduledSequence& p : plan.seqs) {
    if (!p.needs_sample || states_.contains(p.id)) continue;  // mid-prompt, or decoding already
    const Request* r = scheduler.find(p.id);
    if (r == nullptr || state_of(*r).source != DraftSource::draft_model) continue;
    queries.push_back({r->id, r->token_ids, 0, {}, {}, {}});
  }
  if (!queries.empty()) draft_model_->propose(queries);
}

void Speculator::release(std::span<const RequestId> ids) {
  for (RequestId id : ids) states_.erase(id);
  if (draft_model_) draft_model_->release(ids);
}

}  // namespace ember
