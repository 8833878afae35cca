// engine/scheduler.h: continuous batching, vLLM v1 style. There are no prefill/decode phases:
// every request has num_computed_tokens and n_tokens, and each step hands out a token budget —
// running requests first (a decode needs 1 token, a prefill gets a chunk), then waiting ones in
// FCFS (or priority) order. When the KV cache can't give a running request its slots, the
// newest running request is preempted (its blocks freed, recomputed later) and the allocation
// retried. The scheduler never touches block tables: the KVCacheManager answers yes or no.
// Not thread-safe (the engine thread alone uses it; validate() is safe from any thread).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine_options.h"
#include "engine/request.h"
#include "engine/step_plan.h"
#include "kv/kv_cache_manager.h"

namespace ember {

enum class SchedulingPolicy {
  fcfs,      // arrival order; preempt the newest running request
  priority,  // (priority, arrival) order, lower first; preempt the worst running request
};

struct SchedulerConfig {
  int64_t max_batch_tokens = EngineOptions{}.max_batch_tokens;  // token budget of one step
  int parallel = EngineOptions{}.parallel;                      // requests running at once
  int64_t max_model_len = 0;  // tokens a request may reach, prompt included (>= 1: the resolved
                              // EngineOptions::n_ctx)
  SchedulingPolicy policy = SchedulingPolicy::fcfs;
  bool enable_chunked_prefill = true;  // split prompts longer than the remaining budget
};

// What one step produced for one request: a sampled token, and whether that finished it.
struct RequestOutput {
  RequestId id = 0;
  int32_t token = -1;
  FinishReason finish_reason = FinishReason::none;  // none: the request goes on
  int64_t n_prompt_tokens = 0;
  int64_t n_output_tokens = 0;    // including this token
  int64_t n_cached_tokens = 0;    // prompt tokens the prefix cache served
  int64_t n_drafted_tokens = 0;   // drafts of the request verified so far (this step's included)
  int64_t n_accepted_tokens = 0;  // of them, accepted

  bool finished() const { return finish_reason != FinishReason::none; }
};

class Scheduler {
 public:
  // Throws InvalidArgument for a config that could hang (zero budget, unchunked prefill with a
  // budget below the context). The KV manager must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, KVCacheManager& kv);

  const SchedulerConfig& config() const { return config_; }
  // min(config.max_model_len, tokens the whole KV cache holds): one request never needs more
  // blocks than the pool has, so a request running alone always fits.
  int64_t max_model_len() const { return max_model_len_; }

  // Throws InvalidArgument, saying what and why, for a request that could never run: an empty
  // prompt, max_tokens < 1, a prompt longer than the context or than the whole KV cache.
  // Reads only the config, so it is safe from any thread (submitters validate up front).
  void validate(std::span<const int32_t> prompt, const RequestOptions& options) const;
  // Validates and queues a request. Throws InvalidArgument also for an id already in use.
  void add_request(Request request);

  // Plans one step and allocates its KV slots (preempting as needed).
  StepPlan schedule();
  // Applies a step's results: sampled[i] is what the i-th sequence of `plan` with needs_sample
  // got (its accepted drafts, then one token). Advances num_computed_tokens past the known
  // tokens and the accepted drafts, caches newly full blocks, appends the tokens one by one
  // checking stop conditions after each (tokens past a stop are dropped), gives back the blocks
  // that only rejected drafts used, finishes and frees requests. One RequestOutput per token
  // appended. Throws InvalidArgument when the results do not match the plan.
  std::vector<RequestOutput> update_from_output(const StepPlan& plan, std::span<const SampledTokens> sampled);
  // Drafts for a running request's next step (replacing any it had); the plan verifies those
  // that fit the budget, the KV cache, max_tokens and the context. Unknown ids are ignored.
  void set_drafts(RequestId id, std::vector<int32_t> drafts);
  // Running requests, oldest first (for the speculator to read).
  std::span<Request* const> running() const { return running_; }
  // Drafts a request may still have verified: after its k accepted drafts and one token of its
  // own it must stay within max_tokens and the context.
  int64_t max_drafts(const Request& request) const;
  // Finishes a request now (reason `cancelled`, or `error` for a failed step) and frees its
  // blocks. Returns false when the id is unknown or already finished.
  bool cancel(RequestId id, FinishReason reason = FinishReason::cancelled);

  // Ids of requests that finished or were cancelled since the last call (or plan), for runners
  // to drop their state; schedule() moves them into StepPlan::finished.
  std::vector<RequestId> take_finished() { return std::exchange(finished_since_plan_, {}); }

  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_preemptions() const { return n_preemptions_; }
  // A live (not finished) request, or nullptr.
  const Request* find(RequestId id) const;
  const KVCacheManager& kv() const { return kv_; }

  // Throws std::logic_error on a broken invariant: queue membership matches each status,
  // num_computed_tokens <= n_tokens, running requests have slots for their computed tokens and
  // waiting ones have none, plus the KV manager's own invariants.
  void check_invariants() const;

 private:
  bool runs_before(const Request& a, const Request& b) const;
  void enqueue_waiting(Request* request, bool at_front);
  void preempt(size_t running_index, StepPlan& plan, int64_t& budget);
  void finish(Request& request, FinishReason reason);
  FinishReason stop_reason(const Request& request) const;

  SchedulerConfig config_;
  KVCacheManager& kv_;
  int64_t max_model_len_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;  // live requests
  std::vector<Request*> running_;  // in admission order; the back is the newest
  std::deque<Request*> waiting_;   // in scheduling order
  std::vector<RequestId> finished_since_plan_;
  int64_t next_arrival_ = 0;
  int64_t n_preemptions_ = 0;
};

}  // namespace ember
