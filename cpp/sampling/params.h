// sampling/params.h: what one request asks of its sampler. Plain values, validated once when the
// request arrives (validate), so the sampling loop never has to check them again.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ember {

struct SamplingParams {
  float temperature = 0.8f;        // <= 0: greedy (argmax after logit bias and penalties)
  int32_t top_k = 40;              // <= 0: off
  float top_p = 0.95f;             // 1: off
  float min_p = 0.05f;             // 0: off; keeps tokens with p >= min_p * p_max
  float typical_p = 1.0f;          // 1: off (locally typical sampling)
  float repeat_penalty = 1.0f;     // 1: off; divides positive logits, multiplies negative ones
  int32_t repeat_last_n = 64;      // penalty window in tokens; 0: no penalties, -1: every token seen
  float presence_penalty = 0.0f;   // subtracted once from a token that is in the window
  float frequency_penalty = 0.0f;  // subtracted per occurrence in the window
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  uint64_t seed = 0;
  // The first min_tokens outputs are never one of the sampler's stop ids (the request's stop
  // tokens, EOS among them), unless the constraint allows nothing else (vLLM's min_tokens).
  int32_t min_tokens = 0;
};

// Throws InvalidArgument naming the first bad field, e.g. "[sampling] top_p must be in (0, 1], got 1.5".
void validate(const SamplingParams& params, int32_t n_vocab);

}  // namespace ember
