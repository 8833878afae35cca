// engine/model_runner.h: what the engine loop needs from a model — run one batch, sample the
// next token of each sequence that wants one, verifying its drafts on the way. The real runner wraps a
// model's batched forward and the samplers; tests use a fake that writes recognisable values to the slots and
// "samples" deterministic tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/batch.h"
#include "engine/request.h"
#include "engine/step_plan.h"
#include "sampling/logprobs.h"

namespace ember {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Runs `batch` through the model: first makes batch.block_copies in the paged cache, then
  // writes every row's K/V to slot_mapping[row], and returns, for each sequence with output_index >= 0 in
  // batch order, its accepted drafts then one sampled token. A draft is accepted by the rule that leaves the
  // output distribution exactly as without drafts (greedy: it is the argmax). May throw; the engine then
  // fails the batch's requests with the message.
  virtual std::vector<SampledTokens> execute(const Batch& batch) = 0;

  // The K/V of each cache block of `blocks` (out[i] of blocks[i]), every layer, in the runner's
  // own layout: what the disk cache and state files store. Empty payloads when the runner keeps
  // no K/V (a test's fake).
  virtual std::vector<std::vector<uint8_t>> read_blocks(std::span<const int32_t> blocks) {
    return std::vector<std::vector<uint8_t>>(blocks.size());
  }
  // Writes payloads read_blocks() gave (of the same model and cache) into their blocks.
  virtual void write_blocks(std::span<const BlockLoad> loads) {}

  // Requests that left the engine (finished, cancelled, failed): drop any state kept for them.
  virtual void release(std::span<const SequenceId> ids) {}

  // Throws InvalidArgument when the runner could never serve this request (a token id outside
  // the vocabulary, bad sampling parameters). Called by submitters on their own threads, so it
  // must only read state fixed at construction.
  virtual void validate(std::span<const int32_t> prompt, const RequestOptions& options) const {}

  // The prefix-cache namespace of a validated request's K/V: requests share cached blocks (in
  // memory, and on disk across restarts) only within one. 0: the model's own K/V.
  virtual uint64_t cache_namespace(const RequestOptions& options) const { return 0; }
  // Images run through the vision encoder so far (a repeated image is not encoded again).
  virtual int64_t n_images_encoded() const { return 0; }

  // A request entered the engine (loop thread, before its first execute): set up its sampler.
  virtual void add(RequestId id, const RequestOptions& options) {}
};

}  // namespace ember
