// sampling/candidates.cpp: the sampling stages. Sorting is the one cost that grows with the
// vocabulary, so stages sort only as much as they need (top_p sorts a growing prefix).
#include "sampling/candidates.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace ember {

namespace {

bool by_logit_desc(const TokenCandidate& a, const TokenCandidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

bool by_key_asc(const TokenCandidate& a, const TokenCandidate& b) {
  return a.key < b.key || (a.key == b.key && a.id < b.id);
}

// Orders `items` by `before` as far as needed and keeps the shortest prefix whose
// probabilities sum to >= mass (everything when rounding leaves the total just short). The
// sorted prefix grows 8x at a time: the kept set is usually a few dozen tokens out of tens of
// thousands, so a full sort is rare.
template <typename Before>
void keep_mass_prefix(std::vector<TokenCandidate>& items, bool already_sorted, Before before, double mass) {
  const size_t n = items.size();
  size_t sorted_n = already_sorted ? n : std::min<size_t>(n, 64);
  for (;;) {
    if (!already_sorted) {
      std::partial_sort(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(sorted_n), items.end(),
                        before);
    }
    double sum = 0.0;
    for (size_t keep = 0; keep < sorted_n; ++keep) {
      sum += items[keep].p;
      if (sum >= mass) {
        items.resize(keep + 1);
        return;
      }
    }
    if (sorted_n == n) return;
    sorted_n = std::min(n, sorted_n * 8);
  }
}

}  // namespace

void Candidates::reset(const float* logits, int32_t n_vocab) {
  items.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) items[static_cast<size_t>(i)] = {i, logits[i], 0.0f, 0.0f};
  sorted = false;
}

void softmax(Candidates& c) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const TokenCandidate& t : c.items) max_logit = std::max(max_logit, t.logit);
  double sum = 0.0;
  for (TokenCandidate& t : c.items) {
    t.p = std::exp(t.logit - max_logit);  // exp(-inf) = 0 for banned tokens
    sum += t.p;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (TokenCandidate& t : c.items) t.p *= inv;
}

int32_t argmax(const Candidates& c) {
  const TokenCandidate* best = &c.items.front();
  for (const TokenCandidate& t : c.items) {
    if (by_logit_desc(t, *best)) best = &t;
  }
  return best->id;
}

void apply_logit_bias(Candidates& c, const std::vector<std::pair<int32_t, float>>& bias) {
  for (const auto& [id, delta] : bias) c.items[static_cast<size_t>(id)].logit += delta;
}

void apply_penalties(Candidates& c, const int32_t* counts, const std::vector<int32_t>& seen, float repeat,
                     float frequency, float presence) {
  for (int32_t id : seen) {
    const int32_t count = counts[id];
    if (count <= 0) continue;
    float& logit = c.items[static_cast<size_t>(id)].logit;
    logit = logit > 0.0f ? logit / repeat : logit * repeat;
    logit -= static_cast<float>(count) * frequency + presence;
  }
}

void top_k(Candidates& c, int32_t k) {
  if (k <= 0 || k >= c.size()) return;
  if (!c.sorted) {
    std::partial_sort(c.items.begin(), c.items.begin() + k, c.items.end(), by_logit_desc);
  }
  c.items.resize(static_cast<size_t>(k));
  c.sorted = true;
}

void typical_p(Candidates& c, float typical_p) {
  if (typical_p >= 1.0f) return;
  softmax(c);
  double entropy = 0.0;
  for (const TokenCandidate& t : c.items) {
    if (t.p > 0.0f) entropy -= t.p * std::log(static_cast<double>(t.p));
  }
  // Order by distance of surprise from entropy; -log 0 = inf sorts zero-probability tokens last.
  for (TokenCandidate& t : c.items) {
    t.key = static_cast<float>(std::abs(-std::log(static_cast<double>(t.p)) - entropy));
  }
  keep_mass_prefix(c.items, false, by_key_asc, typical_p);
  c.sorted = false;
}

void top_p(Candidates& c, float p) {
  if (p >= 1.0f) return;
  softmax(c);
  keep_mass_prefix(c.items, c.sorted, by_logit_desc, p);
  c.sorted = true;
}

void min_p(Candidates& c, float min_p) {
  if (min_p <= 0.0f) return;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const TokenCandidate& t : c.items) max_logit = std::max(max_logit, t.logit);
  const float threshold = max_logit + std::log(min_p);
  // A stable filter keeps the order (and so `sorted`); the best token always passes.
  auto last = std::remove_if(c.items.begin(), c.items.end(),
                             [threshold](const TokenCandidate& t) { return t.logit < threshold; });
  c.items.erase(last, c.items.end());
}

void apply_temperature(Candidates& c, float temperature) {
  for (TokenCandidate& t : c.items) t.logit /= temperature;
}

}  // namespace ember
