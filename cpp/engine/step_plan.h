// engine/step_plan.h: what the scheduler decided for one step — the narrow value handed to the
// batch builder and back to Scheduler::update_from_output. Counts and ids only: the KV side of
// the step (block tables, slots) stays with the KVCacheManager.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace ember {

struct ScheduledSequence {
  RequestId id = 0;
  int64_t n_tokens = 0;       // tokens to run through the model this step (>= 1)
  int64_t start_pos = 0;      // position of the first of them (the request's num_computed_tokens)
  bool needs_sample = false;  // the chunk reaches the request's last known token: its last row's
                              // logits are sampled into the next token
};

struct StepPlan {
  std::vector<ScheduledSequence> seqs;  // running requests first, then newly admitted ones
  std::vector<RequestId> preempted;     // lost their blocks this step; they wait to recompute
  std::vector<RequestId> finished;      // left the scheduler since the last plan (finished or
                                        // cancelled): runners drop any state they keep for them
  int64_t n_tokens = 0;                 // sum of seqs[i].n_tokens <= max_num_batched_tokens

  bool empty() const { return seqs.empty(); }
  int64_t n_samples() const {
    int64_t n = 0;
    for (const ScheduledSequence& s : seqs) n += s.needs_sample;
    return n;
  }
};

}  // namespace ember
