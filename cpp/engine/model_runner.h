// engine/model_runner.h: what the engine loop needs from a model — run one batch, sample one
// token per output row. The real runner wraps a model's batched forward and the samplers; tests
// use a fake that writes recognisable values to the slots and "samples" deterministic tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/batch.h"
#include "engine/request.h"
#include "sampling/logprobs.h"

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

  // Throws InvalidArgument when the runner could never serve this request (a token id outside
  // the vocabulary, bad sampling parameters). Called by submitters on their own threads, so it
  // must only read state fixed at construction.
  virtual void validate(std::span<const int32_t> prompt, const RequestOptions& options) const {}

  // A request entered the engine (loop thread, before its first execute): set up its sampler.
  virtual void add(RequestId id, const RequestOptions& options) {}

  // Log-probabilities of the last execute()'s samples, indexed like its result, for requests
  // that asked (n_logprobs >= 0; nullopt for the others). May be empty when none asked.
  virtual std::span<const std::optional<TokenLogprobs>> last_logprobs() const { return {}; }
};

}  // namespace ember
