// engine/speculator.h: speculative decoding's policy — before each step it gives decoding
// requests drafts (from prompt lookup, the request's prediction, or a draft model) for the
// scheduler to plan and the runner to verify, as many as pay off. Owns the per-request draft
// state and the draft model; knows nothing of the KV cache or the target model. Engine thread
// only.
//
// How many drafts pay off (the back-off): a step of n rows takes about a + b·n seconds, and a
// draft model's pass over m rows about a_d + b_d·m (both fitted online to measured passes, the
// target's to steps of decoding rows only; the engine's first decode step drafts all it can). A
// request's j-th draft adds v_j expected tokens — the chance that it and every draft before it
// are kept — and costs one target row, b, plus for a draft model one draft row, b_d, and a_d
// more when it needs a draft pass no other request's drafts already pay for (where staged
// drafting, draft_model.h, gets several guesses from one pass, this overprices them: the depth
// errs shallow; fixed depths of 8 and 12 beat it by ~4% on a copy task). Drafts are handed
// out best first while the next one raises the step's expected tokens per second — while
// v_j · time > cost_j · tokens, time and tokens being the step's so far — so when the batch is
// already compute-bound (b·n dominates) or the draft model is slow, drafting stops, and a lone
// memory-bound request drafts deep.
//
// A draft model's cost is measured only by drafting, so an estimate that stops all drafting (a
// cold first pass, a busy moment) would never be corrected. When requests that could draft from
// the draft model have gone undrafted for probe_after steps, the likeliest one drafts up to
// kProbeDepth anyway: a probe, whose passes and verification refresh both fits and its evidence.
// probe_after starts at kFirstProbe and doubles up to kLastProbe while the back-off keeps
// refusing after the probes (where drafting truly does not pay, probes then cost well under 1% of
// the steps), and starts over when the back-off drafts on its own.
//
// v_j comes from recent verifications (the request's own, or for a draft model every request's):
// decayed counts of drafts kept and rejected give p, the chance a draft is kept, and
// v_j = p^(j+1). A prediction's drafts are
// counted apart by how far the output has followed the prediction where they were drafted
// (PredictionCursor::n_matched), so drafts right after a realignment on a short match, which
// often miss, are priced apart from those of a long agreeing run, which rarely do:
// v_j = p(m) · p(m + 1) ··· p(m + j) for a run of m tokens so far. Where no suffix of the output
// is in the prediction, the request's drafts come from prompt lookup over its own text, priced as
// a realignment on a match of that length.
//
// A draft model's drafts are counted apart by the draft's own probability of them (its
// calibration against this target, learned): its depth is priced with p over all of them; while
// it drafts, v_j is recomputed from the bins of guess j and those before it, guess j is kept if
// that still pays for its target row (its draft pass is spent), and a next one is drafted if
// v_j · p, its expected value, pays for a pass and a row as the back-off required of it. This
// takes the place of a fixed threshold on that probability (llama.cpp's --draft-p-min, 0.75):
// SmolLM2 Q4_1 drafting for its f16 original had every draft kept even with a threshold of 0.1
// (186-192 of 186-192), and the threshold of 0.75 gave 1.56x where none gave 1.82x (5 runs
// alternating with plain decoding, Zen 5, 2 threads); a draft that agrees less stops earlier.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/draft_lookup.h"
#include "engine/engine_options.h"
#include "engine/request.h"
#include "engine/step_plan.h"

namespace ember {

class Scheduler;

enum class DraftSource { none, ngram, prediction, draft_model };
inline constexpr int kNumDraftSources = 4;
std::string_view to_string(DraftSource source);

struct SpeculationConfig {
  DraftSource source = DraftSource::none;     // for every request: none, ngram or draft_model; a
                                              // request with a prediction drafts from it instead
  int draft_max = EngineOptions{}.draft_max;  // drafts per request and step at most
  int draft_min = EngineOptions{}.draft_min;  // a request given fewer drafts than this gets none
  int ngram_min = 2;                          // prompt lookup matches suffixes of ngram_min..ngram_max
  int ngram_max = 4;
  bool adaptive = EngineOptions{}.spec_adaptive;  // the back-off above (and a draft model's p_min); false:
                                                  // always draft_max (tests, benchmarks)
};

// Step time = fixed_s + per_row_s · rows, least squares over recent steps (exponentially
// forgotten), with fixed_s >= per_row_s. Until the rows have varied enough to tell the two
// apart, a step is assumed to cost as much as kPriorRows extra rows in fixed overhead.
class StepCostModel {
 public:
  void add(int64_t n_rows, double seconds);
  double fixed_s() const { return fixed_s_; }
  double per_row_s() const { return per_row_s_; }
  bool known() const { return n_ > 0; }

 private:
  static constexpr double kDecay = 0.97, kPriorRows = 8.0;
  double s0_ = 0, sn_ = 0, st_ = 0, snn_ = 0, snt_ = 0;
  int64_t n_ = 0;
  double fixed_s_ = 0, per_row_s_ = 0;
};

// A small model guessing requests' next tokens greedily, with its own KV cache.
class DraftModel {
 public:
  struct Query {
    RequestId id = 0;
    std::span<const int32_t> tokens;  // the request's tokens so far (prompt, then output)
    int64_t n_draft = 0;              // drafts wanted; 0: only catch up on tokens (a new prompt)
    // Judges each guess as it comes, from the draft's probability of it: keep it or not, and
    // whether to guess on after it. Empty: every guess kept, up to n_draft.
    struct Verdict {
      bool keep, more;
    };
    std::function<Verdict(float)> judge;
    std::vector<int32_t> drafts;       // filled: at most n_draft tokens
    std::vector<float> probabilities;  // filled: the draft's probability of each of them
  };
  virtual ~DraftModel() = default;
  // Throws InvalidArgument when the draft model cannot serve this target (another vocabulary).
  virtual void propose(std::span<Query> queries) = 0;
  virtual void release(std::span<const RequestId> ids) = 0;
  // The cost of one of its forward passes by rows (propose() runs one per guess, every query's
  // rows together), fitted to the passes it ran to draft (not to a new prompt's catch-up).
  virtual const StepCostModel& cost() const = 0;
};

// Drafted and accepted tokens per source, for /metrics.
struct SpeculationStats {
  std::array<int64_t, kNumDraftSources> n_drafted{};
  std::array<int64_t, kNumDraftSources> n_accepted{};
};

class Speculator {
 public:
  // draft_model may be null; config.source == draft_model then throws InvalidArgument. The draft
  // counts come checked (EngineOptions::check): 1 <= draft_max, 0 <= draft_min <= draft_max.
  Speculator(const SpeculationConfig& config, std::unique_ptr<DraftModel> draft_model);
  // Requests' states point into it (draft_evidence_): it stays where it was made.
  Speculator(const Speculator&) = delete;
  Speculator& operator=(const Speculator&) = delete;

  // Before Scheduler::schedule(): drafts for every running request that is decoding.
  void propose(Scheduler& scheduler);
  // After the step: its cost, and how each request's drafts fared.
  void observe(const StepPlan& plan, std::span<const SampledTokens> sampled, double seconds);
  // After the step, before its tokens go out: the draft model reads the prompts that were
  // completed in it, so that this is part of the prompt's time (as the target's prefill is, and
  // as in llama.cpp) and the first drafting step reads only the token sampled after it.
  void catch_up(const StepPlan& plan, const Scheduler& scheduler);
  // Requests that left the engine.
  void release(std::span<const RequestId> ids);

  const SpeculationConfig& config() const { return config_; }
  const SpeculationStats& stats() const { return stats_; }
  const StepCostModel& cost() const { return cost_; }
  const DraftModel* draft_model() const { return draft_model_.get(); }

 private:
  // A prediction's bins: agreement-run lengths m of 0, 1, 2-3, 4-7, 8-15, 16 and more; a draft
  // model's: its probability of the draft below 0.3, 0.5, 0.7, 0.85, 0.95, and above.
  static constexpr int kBins = 6;
  // Per step a request could draft but is not given drafts, its evidence is multiplied by this.
  static constexpr double kUndraftedForget = 0.9;
  static constexpr int64_t kProbeDepth = 4, kFirstProbe = 8, kLastProbe = 512;
  // Decayed counts per bin: drafts kept, and drafts rejected (a verification rejects at most
  // one). Prompt lookup counts everything in bin 0.
  struct Evidence {
    DraftSource source = DraftSource::none;
    std::array<double, kBins> kept{}, rejected{};
    double keep_chance(int bin) const;  // p of a draft in `bin`
    double mean_keep_chance() const;    // a draft model's p over all bins, before its drafts exist
  };
  struct RequestState {
    DraftSource source = DraftSource::none;
    PredictionCursor prediction;
    // A prediction's and prompt lookup's evidence is the request's own (their drafts come from
    // its text); a draft model's is draft_evidence_, every request's (how often the draft agrees
    // with the target is the pair's), so a new request starts from what the last ones learned.
    Evidence own;
    Evidence* evidence = &own;
    int64_t run_at_draft = 0;        // the run length m when the drafts now being verified were made
    std::vector<float> probability;  // the draft model's probability of each of them
  };
  struct Candidate {
    const Request* request;
    RequestState* state;
    std::vector<int32_t> drafts;  // for lookup sources; a draft model's come after depths()
    std::vector<double> value;    // [max depth] v_j
    // [depth] the v_j each draft given had to reach to pay for its rows and passes, and for its
    // target row alone.
    std::vector<double> min_value, min_kept_value;
  };

  RequestState& state_of(const Request& request);
  // Depth per candidate; fills their min_value and min_kept_value.
  std::vector<int64_t> depths(std::span<Candidate> candidates, int64_t n_plain_rows, int64_t n_samples,
                              int64_t budget) const;
  // The probe of the top of this file: may raise one draft-model candidate's depth.
  void probe(std::span<Candidate> candidates, std::span<int64_t> depth, int64_t n_plain_rows, int64_t budget);

  SpeculationConfig config_;
  std::unique_ptr<DraftModel> draft_model_;
  std::unordered_map<RequestId, RequestState> states_;  // (nodes stay put: `evidence` may point into one)
  Evidence draft_evidence_{DraftSource::draft_model, {}, {}};
  SpeculationStats stats_;
  StepCostModel cost_;
  int64_t undrafted_steps_ = 0, probe_after_ = kFirstProbe;
};

}  // namespace ember
