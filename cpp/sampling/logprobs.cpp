// sampling/logprobs.cpp: log-softmax of raw logits and the top-N alternatives.
#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace ember {

TokenLogprobs token_logprobs(const float* logits, int32_t n_vocab, int32_t token, int32_t n_top) {
  if (token < 0 || token >= n_vocab) {
    throw InvalidArgument(cat("[sampling] logprobs: token id ", token, " is outside [0, ", n_vocab, ")"));
  }
  if (n_top < 0) throw InvalidArgument(cat("[sampling] logprobs: top count must be >= 0, got ", n_top));
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);

  TokenLogprobs out;
  out.logprob = static_cast<float>(logits[token] - log_z);
  const int32_t n = std::min(n_top, n_vocab);
  std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  out.top.reserve(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) {
    out.top.emplace_back(ids[static_cast<size_t>(k)],
                         static_cast<float>(logits[ids[static_cast<size_t>(k)]] - log_z));
  }
  return out;
}

}  // namespace ember
