// engine/scheduler.cpp: token-budget scheduling with chunked prefill and preemption by
// recomputation. Owns the requests; the KV manager owns their blocks.
#include "engine/scheduler.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "core/error.h"

namespace ember {

namespace {

// n tokens of r from position `start`, cut so that the chunk never ends inside one of its
// images: an image's rows run in one pass (Gemma 3's image tokens attend to each other both
// ways, so the rows of one image must all be in the cache when any of them attends). A chunk
// that would end inside an image ends before it; one that starts inside an image (a prefix hit
// ending there) must reach its end, else it gets 0 tokens this step.
int64_t without_split_image(const Request& r, int64_t start, int64_t n) {
  for (const RequestImage& image : r.options.images) {
    const int64_t end = start + n;
    if (end <= image.pos || end >= image.end()) continue;
    n = image.pos > start ? image.pos - start : 0;
  }
  return n;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KVCacheManager& kv)
    : config_(config), kv_(kv), max_model_len_(std::min(config.max_model_len, kv.capacity_tokens())) {
  if (config.max_batch_tokens < 1) {
    throw InvalidArgument(cat("[scheduler] max_batch_tokens must be >= 1, got ", config.max_batch_tokens));
  }
  if (config.parallel < 1) {
    throw InvalidArgument(cat("[scheduler] parallel must be >= 1, got ", config.parallel));
  }
  if (config.max_model_len < 1) {
    throw InvalidArgument(cat("[scheduler] max_model_len must be >= 1, got ", config.max_model_len));
  }
  if (!config.enable_chunked_prefill && config.max_batch_tokens < max_model_len_) {
    throw InvalidArgument(cat("[scheduler] without chunked prefill max_batch_tokens (",
                              config.max_batch_tokens, ") must cover the context (", max_model_len_,
                              " tokens), or long prompts could never run"));
  }
}

void Scheduler::validate(std::span<const int32_t> prompt, const RequestOptions& options) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) throw InvalidRequest("[request] the prompt is empty: at least one token is needed");
  if (options.max_tokens < 1) {
    throw InvalidRequest(cat("[request] max_tokens must be >= 1, got ", options.max_tokens));
  }
  if (n > config_.max_model_len) {
    throw PromptTooLong(
        cat("[request] the prompt has ", n, " tokens, more than the context of ", config_.max_model_len,
            " tokens (which prompt and output share); use a shorter prompt or a larger n_ctx"),
        n, config_.max_model_len);
  }
  if (n > kv_.capacity_tokens()) {
    throw PromptTooLong(cat("[request] the prompt has ", n, " tokens, more than the whole KV cache holds (",
                            kv_.n_blocks(), " blocks of ", kv_.block_size(), " = ", kv_.capacity_tokens(),
                            " tokens); raise the KV cache size"),
                        n, kv_.capacity_tokens());
  }
  int64_t image_end = 0;
  for (const RequestImage& image : options.images) {
    if (image.pos < image_end || image.n_tokens < 1 || image.end() > n) {
      throw InvalidRequest(cat("[request] an image at positions ", image.pos, "..", image.end() - 1,
                               " does not lie inside the prompt of ", n, " tokens after the one before it"));
    }
    if (image.n_tokens > config_.max_batch_tokens) {
      throw InvalidRequest(cat("[request] an image of ", image.n_tokens, " tokens is more than one step's ",
                               config_.max_batch_tokens,
                               " tokens (max_batch_tokens), which must hold it whole"));
    }
    image_end = image.end();
  }
}

void Scheduler::add_request(Request request) {
  validate(request.prompt_token_ids(), request.options);
  if (request.n_output_tokens() != 0 || request.num_computed_tokens != 0) {
    throw InvalidArgument(
        cat("[request] request ", request.id, " must arrive with no output and nothing computed"));
  }
  if (requests_.contains(request.id))
    throw InvalidArgument(cat("[request] id ", request.id, " is already in use"));
  auto owned = std::make_unique<Request>(std::move(request));
  Request* r = owned.get();
  r->arrival = next_arrival_++;
  r->status = RequestStatus::waiting;
  r->finish_reason = FinishReason::none;
  requests_.emplace(r->id, std::move(owned));
  enqueue_waiting(r, /*at_front=*/false);
}

bool Scheduler::runs_before(const Request& a, const Request& b) const {
  if (config_.policy == SchedulingPolicy::priority && a.options.priority != b.options.priority) {
    return a.options.priority < b.options.priority;
  }
  return a.arrival < b.arrival;
}

// FCFS: new requests join the back, preempted ones the front (they were admitted before anyone
// still waiting). Priority: the queue stays sorted by (priority, arrival).
void Scheduler::enqueue_waiting(Request* request, bool at_front) {
  if (config_.policy == SchedulingPolicy::priority) {
    const auto at = std::upper_bound(waiting_.begin(), waiting_.end(), request,
                                     [&](const Request* a, const Request* b) { return runs_before(*a, *b); });
    waiting_.insert(at, request);
  } else if (at_front) {
    waiting_.push_front(request);
  } else {
    waiting_.push_back(request);
  }
}

// Frees running_[running_index]'s blocks and sends it back to wait; it will recompute every
// token it has (prompt and output so far). If it was already planned this step, its tokens go
// back to the budget.
void Scheduler::preempt(size_t running_index, StepPlan& plan, int64_t& budget) {
  Request* r = running_[running_index];
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  const auto planned = std::ranges::find(plan.seqs, r->id, &ScheduledSequence::id);
  if (planned != plan.seqs.end()) {
    budget += planned->n_tokens;
    plan.n_tokens -= planned->n_tokens;
    plan.seqs.erase(planned);
  }
  kv_.free(r->id);
  r->num_computed_tokens = 0;
  r->draft_token_ids.clear();
  r->status = RequestStatus::preempted;
  ++r->n_preemptions;
  ++n_preemptions_;
  plan.preempted.push_back(r->id);
  enqueue_waiting(r, /*at_front=*/true);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.finished = take_finished();
  int64_t budget = config_.max_batch_tokens;
  const auto plan_step = [&](Request& r, int64_t n_new, std::vector<int32_t> drafts = {}) {
    const int64_t n_drafts = static_cast<int64_t>(drafts.size());
    plan.seqs.push_back({r.id, n_new + n_drafts, r.num_computed_tokens,
                         r.num_computed_tokens + n_new == r.n_tokens(), std::move(drafts)});
    plan.n_tokens += n_new + n_drafts;
    budget -= n_new + n_drafts;
  };

  // 1. Running requests, oldest first: each gets the rest of its tokens (1 when decoding), up to
  //    the budget. On allocation failure, preempt the newest (or worst-priority) one and retry.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    const int64_t n_remaining = r.n_tokens() - r.num_computed_tokens;
    if (!config_.enable_chunked_prefill && n_remaining > budget) {
      ++i;
      continue;
    }
    const int64_t n_new = without_split_image(r, r.num_computed_tokens, std::min(n_remaining, budget));
    if (n_new == 0) {  // the rest of an image does not fit this step's budget
      ++i;
      continue;
    }
    // Drafts ride along only on a decode (the last known token is all that is left), within the
    // budget, and never at the price of preempting anyone: without room they are dropped.
    std::vector<int32_t> drafts = std::exchange(r.draft_token_ids, {});
    if (n_remaining == 1 && !drafts.empty()) {
      const int64_t n_fit = std::min({static_cast<int64_t>(drafts.size()), budget - 1, max_drafts(r)});
      drafts.resize(static_cast<size_t>(std::max<int64_t>(0, n_fit)));
      if (!drafts.empty() && kv_.allocate_slots(r.kv_state(), 1 + static_cast<int64_t>(drafts.size()))) {
        plan_step(r, 1, std::move(drafts));
        ++i;
        continue;
      }
    }
    bool scheduled = false;
    while (true) {
      if (kv_.allocate_slots(r.kv_state(), n_new)) {
        scheduled = true;
        break;
      }
      size_t victim = running_.size() - 1;
      if (config_.policy == SchedulingPolicy::priority) {
        for (size_t j = 0; j < running_.size(); ++j) {
          if (runs_before(*running_[victim], *running_[j])) victim = j;
        }
      }
      preempt(victim, plan, budget);
      if (victim == i) break;  // r itself was the one to go
      if (victim < i) --i;     // an already planned request left; r moved down one place
    }
    if (scheduled) {
      plan_step(r, n_new);
      ++i;
    }
  }

  // 2. Waiting requests, in order, while there is budget and a free slot — unless someone was
  //    just preempted (admitting others would only take their blocks back). Stops at the first
  //    that doesn't fit, so nobody overtakes it.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.parallel) {
    Request& r = *waiting_.front();
    PrefixHit hit = r.options.reuse_prefix ? kv_.get_computed_blocks(r.kv_state()) : PrefixHit{};
    // A partial hit also holds its copy's source for the step; when that block is what the
    // pool lacks, the request runs without it rather than waiting for it.
    std::optional<int64_t> n_new;
    for (bool retry = false; !n_new; retry = true) {
      if (retry) {
        if (!hit.has_partial()) break;
        hit = hit.without_partial();
      }
      const int64_t n_remaining = r.n_tokens() - hit.n_tokens();
      if (!config_.enable_chunked_prefill && n_remaining > budget) break;
      const int64_t n = without_split_image(r, hit.n_tokens(), std::min(n_remaining, budget));
      if (n == 0) break;
      if (kv_.allocate_slots(r.kv_state(), n, hit)) n_new = n;
    }
    if (!n_new) break;
    waiting_.pop_front();
    r.num_computed_tokens = hit.n_tokens();
    if (r.n_cached_tokens < 0) r.n_cached_tokens = hit.n_tokens();
    r.status = RequestStatus::running;
    running_.push_back(&r);
    plan_step(r, *n_new);
  }
  plan.block_copies = kv_.take_block_copies();
  plan.block_loads = kv_.take_block_loads();
  return plan;
}

FinishReason Scheduler::stop_reason(const Request& r) const {
  const int32_t last = r.token_ids.back();
  if (std::ranges::find(r.options.stop_token_ids, last) != r.options.stop_token_ids.end())
    return FinishReason::stop;
  if (r.n_output_tokens() >= r.options.max_tokens || r.n_tokens() >= max_model_len_)
    return FinishReason::length;
  return FinishReason::none;
}

int64_t Scheduler::max_drafts(const Request& r) const {
  const int64_t by_tokens = r.options.max_tokens - r.n_output_tokens() - 1;
  const int64_t by_context = max_model_len_ - r.n_tokens() - 1;
  return std::max<int64_t>(0, std::min(by_tokens, by_context));
}

void Scheduler::set_drafts(RequestId id, std::vector<int32_t> drafts) {
  const auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status != RequestStatus::running) return;
  it->second->draft_token_ids = std::move(drafts);
}

std::vector<RequestOutput> Scheduler::update_from_output(const StepPlan& plan,
                                                         std::span<const SampledTokens> sampled) {
  if (static_cast<int64_t>(sampled.size()) != plan.n_samples()) {
    throw InvalidArgument(cat("[scheduler] the step planned ", plan.n_samples(),
                              " samples, the runner returned ", sampled.size()));
  }
  std::vector<RequestOutput> outputs;
  size_t k = 0;
  for (const ScheduledSequence& s : plan.seqs) {
    const SampledTokens* got = s.needs_sample ? &sampled[k++] : nullptr;
    if (got && (got->tokens.empty() || got->n_accepted() > s.n_drafts() ||
                !std::equal(got->tokens.begin(), got->tokens.end() - 1, s.draft_tokens.begin()))) {
      throw InvalidArgument(cat("[scheduler] request ", s.id, ": the runner's ", got->tokens.size(),
                                " tokens are not accepted drafts of the ", s.n_drafts(),
                                " planned plus one"));
    }
    const auto it = requests_.find(s.id);
    // A request cancelled after the plan was made: its results are dropped.
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (r.status != RequestStatus::running || r.num_computed_tokens != s.start_pos) {
      throw std::logic_error(cat("[scheduler] request ", r.id, " (", to_string(r.status), ", ",
                                 r.num_computed_tokens, " computed) does not match its plan (start ",
                                 s.start_pos, ")"));
    }
    if (!got) {
      r.num_computed_tokens += s.n_tokens;
      kv_.cache_computed_blocks(r.kv_state());
      kv_.release_outside_window(r.kv_state());
      continue;
    }
    // The rows of the known tokens and of the accepted drafts hold valid K/V; those of the
    // rejected drafts lie past num_computed_tokens, never in a block the prefix cache registers
    // (only full blocks of computed tokens are), and later steps overwrite them.
    r.num_computed_tokens += s.n_tokens - s.n_drafts() + got->n_accepted();
    r.n_drafted_tokens += s.n_drafts();
    r.n_accepted_tokens += got->n_accepted();
    FinishReason reason = FinishReason::none;
    for (int32_t token : got->tokens) {
      r.token_ids.push_back(token);
      reason = stop_reason(r);
      outputs.push_back({r.id, token, reason, r.n_prompt_tokens, r.n_output_tokens(),
                         std::max<int64_t>(0, r.n_cached_tokens), r.n_drafted_tokens, r.n_accepted_tokens});
      if (reason != FinishReason::none) break;
    }
    // Before a finish frees them: full blocks of computed tokens serve later prompts.
    kv_.cache_computed_blocks(r.kv_state());
    kv_.release_outside_window(r.kv_state());
    if (reason != FinishReason::none) {
      finish(r, reason);
      continue;
    }
    // Blocks past the last known token held only rejected drafts: back to the pool.
    kv_.trim(r.id, r.n_tokens());
  }
  return outputs;
}

bool Scheduler::cancel(RequestId id, FinishReason reason) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  finish(*it->second, reason);
  return true;
}

// Frees the request's blocks, drops it from its queue and forgets it.
void Scheduler::finish(Request& r, FinishReason reason) {
  kv_.free(r.id);
  std::erase(running_, &r);
  std::erase(waiting_, &r);
  r.status = RequestStatus::finished;
  r.finish_reason = reason;
  finished_since_plan_.push_back(r.id);
  requests_.erase(r.id);  // destroys r
}

const Request* Scheduler::find(RequestId id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::check_invariants() const {
  const auto fail = [](const auto&... what) {
    throw std::logic_error(cat("[scheduler] invariant broken: ", what...));
  };
  if (running_.size() + waiting_.size() != requests_.size()) {
    fail(running_.size(), " running + ", waiting_.size(), " waiting != ", requests_.size(), " live requests");
  }
  if (static_cast<int64_t>(running_.size()) > config_.parallel) fail(running_.size(), " running > parallel");
  const int64_t bs = kv_.block_size();
  for (const Request* r : running_) {
    if (r->status != RequestStatus::running)
      fail("request ", r->id, " is running with status ", to_string(r->status));
    if (r->num_computed_tokens > r->n_tokens()) fail("request ", r->id, " computed more tokens than it has");
    if (static_cast<int64_t>(kv_.block_table(r->id).size()) < (r->num_computed_tokens + bs - 1) / bs) {
      fail("request ", r->id, " has ", r->num_computed_tokens, " computed tokens but ",
           kv_.block_table(r->id).size(), " blocks");
    }
  }
  for (const Request* r : waiting_) {
    if (r->status != RequestStatus::waiting && r->status != RequestStatus::preempted) {
      fail("request ", r->id, " waits with status ", to_string(r->status));
    }
    if (r->num_computed_tokens != 0 || kv_.has(r->id)) fail("waiting request ", r->id, " holds KV");
  }
  kv_.check_invariants();
}

}  // namespace ember
