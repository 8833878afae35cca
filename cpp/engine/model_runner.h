// engine/model_runner.h: what the engine loop needs from a model — run one batch, sample one
// token per output row. The real runner wraps a model's batched forward and the samplers; tests
// use a fake that writes recognisable values to the slots and "samples" deterministic tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/batch.h"

namespace ember {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Runs `batch` through the model: writes every row's K/V to slot_mapping[row] of the paged
  // cache, and returns one sampled token per entry of batch.output_rows, in that order.
  // May throw; the engine then fails the batch's requests with the message.
  virtual std::vector<int32_t> execute(const Batch& batch) = 0;

  // Requests that left the engine (finished, cancelled, failed): drop any state kept for them.
  virtual void release(std::span<const SequenceId> ids) {}
};

}  // namespace ember
