// sampling/logprobs.h: log-probabilities as OpenAI reports them — log-softmax of the model's raw
// logits, before logit bias, penalties, temperature or any filter touched them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ember {

struct TokenLogprobs {
  float logprob;                               // of the chosen token
  std::vector<std::pair<int32_t, float>> top;  // [min(n_top, n_vocab)]: (id, logprob), most likely first
};

// log p_i = l_i - (max + log sum_j exp(l_j - max)) over logits[n_vocab]. Throws InvalidArgument
// when token is outside [0, n_vocab) or n_top < 0.
TokenLogprobs token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t n_top);

}  // namespace ember
