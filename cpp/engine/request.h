// engine/request.h: one generation request as the scheduler tracks it — its tokens (prompt,
// then output), how many have K/V in the cache, its status and stop conditions. Plain data: the
// scheduler changes it, everyone else reads it.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "sampling/constraint.h"
#include "sampling/params.h"

namespace ember {

using RequestId = SequenceId;

// A request that can never run, found when it is submitted (a bad token id, an empty prompt, a
// bad max_tokens or logprobs count). Python: ember.InvalidRequest, a ValueError.
class InvalidRequest : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A prompt longer than a request may grow (the context, or the whole KV cache when that is
// smaller). Python: ember.PromptTooLong, an InvalidRequest with n_prompt_tokens and n_ctx.
class PromptTooLong : public InvalidRequest {
 public:
  PromptTooLong(const std::string& message, int64_t n_prompt_tokens, int64_t n_ctx)
      : InvalidRequest(message), n_prompt_tokens(n_prompt_tokens), n_ctx(n_ctx) {}
  int64_t n_prompt_tokens;
  int64_t n_ctx;  // the limit it is over
};

enum class RequestStatus { waiting, running, preempted, finished };

enum class FinishReason {
  none,       // still going
  stop,       // sampled one of its stop tokens (EOS)
  length,     // max_tokens generated, or the context is full
  cancelled,  // cancel() — a client went away, or a stop string matched upstream
  error,      // the model runner failed
};

std::string_view to_string(RequestStatus status);
std::string_view to_string(FinishReason reason);

// One image of a prompt: its run of n_tokens prompt positions [pos, pos + n_tokens) takes the
// vision projector's embeddings of `pixels` instead of token lookups. The prompt's tokens there
// are placeholders derived from `hash` (ember.vision.image_hash: the pixels' content), so the
// prefix cache keys those positions by the image, not by a shared soft-token id.
struct RequestImage {
  int64_t pos = 0;                                   // first prompt position of the image's run
  int64_t n_tokens = 0;                              // its length: the projector's tokens for this image
  uint64_t hash = 0;                                 // content hash: equal hashes are one image, encoded once
  std::shared_ptr<const std::vector<float>> pixels;  // f32 [3, height, width], preprocessed
  int64_t width = 0;
  int64_t height = 0;

  int64_t end() const { return pos + n_tokens; }
};

// What a caller chooses about a request.
struct RequestOptions {
  int64_t max_tokens = 256;             // output tokens at most (>= 1)
  int priority = 0;                     // lower runs first under the priority policy
  std::vector<int32_t> stop_token_ids;  // sampling one finishes the request (it is still output)
  SamplingParams sampling;              // the runner's sampler for this request (fake runners ignore it)
  // Log-probabilities of each sampled token under the raw logits: -1 off, 0 the chosen token's
  // only, k > 0 also the k most likely tokens (see TokenEvent).
  int32_t n_logprobs = -1;
  // With n_logprobs: the values are log-probabilities after the sampler chain (logit bias,
  // penalties, top_k ... temperature; llama-server's post_sampling_probs), the alternatives
  // those the chain kept (at most n_logprobs, fewer when it kept fewer).
  bool post_sampling_probs = false;
  // false: the prompt is computed in full, no prefix-cache block reused (llama-server's
  // cache_prompt); its blocks are still cached for later requests.
  bool reuse_prefix = true;
  // Predicted Outputs: the output the caller expects (an edited file, a form to refill). The
  // engine drafts from it; the output is exactly what it would be without it.
  std::vector<int32_t> prediction;
  // The LoRA adapter the request runs with: an index into the runner's adapters (-1: none), and
  // the factor on its low-rank product (llama-server's scale; alpha / rank comes on top).
  int32_t lora_adapter = -1;
  float lora_scale = 1.0f;
  // Constrained decoding: every output token is one the grammar allows, and end-of-generation
  // tokens only where the output is complete. Null: unconstrained. Shared, immutable.
  std::shared_ptr<const Grammar> grammar;
  // The prompt's images, ascending and apart (ModelRunner::validate checks them against the
  // projector; the scheduler never ends a prefill chunk inside one).
  std::vector<RequestImage> images;
};

struct Request {
  RequestId id = 0;
  std::vector<int32_t> token_ids;  // [n_prompt_tokens + n_output_tokens] prompt, then output
  int64_t n_prompt_tokens = 0;
  // Leading token_ids whose K/V is in the cache. Invariant: <= n_tokens(); the tokens in
  // [n_computed_tokens, n_tokens()) are what the next steps must run through the model.
  int64_t num_computed_tokens = 0;
  RequestOptions options;
  int64_t arrival = 0;  // order of add_request, FCFS tie-breaker
  RequestStatus status = RequestStatus::waiting;
  FinishReason finish_reason = FinishReason::none;
  int64_t n_cached_tokens = -1;  // prompt tokens served by the prefix cache at first schedule
  int n_preemptions = 0;
  // Guesses of the tokens after token_ids, set by the speculator for the next step only: the
  // step runs them after the last known token and keeps those the model agrees with.
  std::vector<int32_t> draft_token_ids;
  int64_t n_drafted_tokens = 0;   // drafts verified so far
  int64_t n_accepted_tokens = 0;  // of them, kept
  // The prefix-cache namespace of its K/V (ModelRunner::cache_namespace; set by Engine::submit):
  // 0 for the model's own, else one per LoRA adapter content and scale.
  uint64_t cache_namespace = 0;

  Request() = default;
  Request(RequestId id_, std::span<const int32_t> prompt, RequestOptions options_)
      : id(id_),
        token_ids(prompt.begin(), prompt.end()),
        n_prompt_tokens(static_cast<int64_t>(prompt.size())),
        options(std::move(options_)) {}

  int64_t n_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t n_output_tokens() const { return n_tokens() - n_prompt_tokens; }
  std::span<const int32_t> prompt_token_ids() const {
    return {token_ids.data(), static_cast<size_t>(n_prompt_tokens)};
  }
  std::span<const int32_t> output_token_ids() const {
    return std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(n_prompt_tokens));
  }
  bool is_finished() const { return status == RequestStatus::finished; }
  SequenceState kv_state() const { return {id, token_ids, num_computed_tokens, cache_namespace}; }
};

}  // namespace ember
