// engine/batch_builder.h: turns a StepPlan into the flat Batch a model consumes, reading tokens
// from the scheduler's requests and block tables / slots from the KV manager.
#pragma once

#include "engine/batch.h"
#include "engine/scheduler.h"
#include "engine/step_plan.h"

namespace ember {

// The batch of `plan`, which must be the scheduler's latest (not yet updated) plan.
Batch build_batch(const StepPlan& plan, const Scheduler& scheduler);

}  // namespace ember
