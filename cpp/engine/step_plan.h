// engine/step_plan.h: what the scheduler decided for one step — the narrow value handed to the
// batch builder and back to Scheduler::update_from_output. Counts and ids only: the KV side of
// the step (block tables, slots) stays with the KVCacheManager.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache_manager.h"
#include "sampling/logprobs.h"

namespace ember {

struct ScheduledSequence {
  RequestId id = 0;
  int64_t n_tokens = 0;       // tokens to run through the model this step (>= 1)
  int64_t start_pos = 0;      // position of the first of them (the request's num_computed_tokens)
  bool needs_sample = false;  // the chunk reaches the request's last known token: its last row's
                              // logits are sampled into the next token
  // Drafts verified this step: the last draft_tokens.size() of the n_tokens rows, after the
  // request's last known token. Each of their rows and the one before it is sampled; only with
  // needs_sample.
  std::vector<int32_t> draft_tokens;

  int64_t n_drafts() const { return static_cast<int64_t>(draft_tokens.size()); }
};

// What the runner sampled for one sequence of a plan with needs_sample: the drafts it accepted
// (a prefix of draft_tokens), then one token of the model's own — the correction at the first
// rejected draft, or the token after the last draft when all were accepted.
struct SampledTokens {
  std::vector<int32_t> tokens;          // [1 + n_accepted]
  std::vector<TokenLogprobs> logprobs;  // [tokens.size()] when the request asked for them, else empty

  int64_t n_accepted() const { return static_cast<int64_t>(tokens.size()) - 1; }
};

struct StepPlan {
  std::vector<ScheduledSequence> seqs;  // running requests first, then newly admitted ones
  std::vector<RequestId> preempted;     // lost their blocks this step; they wait to recompute
  std::vector<RequestId> finished;      // left the scheduler since the last plan (finished or
                                        // cancelled): runners drop any state they keep for them
  std::vector<BlockCopy> block_copies;  // K/V rows to copy before the step runs (partial
                                        // prefix hits of newly admitted requests)
  std::vector<BlockLoad> block_loads;   // blocks read from the disk cache, to write before the
                                        // step runs (disk prefix hits of newly admitted requests)
  int64_t n_tokens = 0;                 // sum of seqs[i].n_tokens <= max_batch_tokens

  bool empty() const { return seqs.empty(); }
  int64_t n_samples() const {
    int64_t n = 0;
    for (const ScheduledSequence& s : seqs) n += s.needs_sample;
    return n;
  }
};

}  // namespace ember
