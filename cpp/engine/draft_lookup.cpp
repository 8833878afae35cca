// engine/draft_lookup.cpp: n-gram matching over a request's history and its prediction.
#include "engine/draft_lookup.h"

#include <algorithm>

namespace ember {
namespace {

// First start s in [from, haystack.size() - n) where haystack[s, s + n) == needle (n tokens, so
// at least one token follows the match), or -1.
int64_t find_forward(std::span<const int32_t> haystack, std::span<const int32_t> needle, int64_t from) {
  const int64_t n = static_cast<int64_t>(needle.size()), size = static_cast<int64_t>(haystack.size());
  for (int64_t s = std::max<int64_t>(0, from); s + n < size; ++s) {
    if (std::equal(needle.begin(), needle.end(), haystack.begin() + s)) return s;
  }
  return -1;
}

}  // namespace

std::vector<int32_t> ngram_drafts(std::span<const int32_t> history, int n_min, int n_max, int64_t n_draft,
                                  int64_t* n_matched) {
  const int64_t size = static_cast<int64_t>(history.size());
  if (n_matched) *n_matched = 0;
  if (n_draft < 1) return {};
  for (int64_t n = std::min<int64_t>(n_max, size - 1); n >= std::max(1, n_min); --n) {
    const auto suffix = history.subspan(static_cast<size_t>(size - n));
    // The most recent earlier occurrence (it ends before the suffix starts ending).
    for (int64_t s = size - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + s)) continue;
      const int64_t from = s + n, to = std::min(size, from + n_draft);
      if (n_matched) *n_matched = n;
      return {history.begin() + from, history.begin() + to};
    }
  }
  return {};
}

void PredictionCursor::realign(std::span<const int32_t> output) {
  const int64_t n_out = static_cast<int64_t>(output.size());
  for (int64_t n = std::min<int64_t>(8, n_out); n >= 1; --n) {
    const auto suffix = output.subspan(static_cast<size_t>(n_out - n));
    int64_t s = find_forward(prediction_, suffix, lost_at_ - n);
    if (s < 0 && n >= 2) s = find_forward(prediction_, suffix, 0);
    if (s >= 0) {
      pos_ = s + n;
      n_matched_ = n;
      return;
    }
  }
}

std::vector<int32_t> PredictionCursor::drafts(std::span<const int32_t> output, int64_t n_draft) {
  const int64_t size = static_cast<int64_t>(prediction_.size());
  for (; n_seen_ < static_cast<int64_t>(output.size()); ++n_seen_) {
    if (pos_ < 0) continue;
    if (pos_ < size && prediction_[pos_] == output[n_seen_]) {
      ++pos_;
      ++n_matched_;
    } else {
      lost_at_ = pos_;
      pos_ = -1;
      n_matched_ = 0;
    }
  }
  if (pos_ < 0) realign(output);
  if (pos_ < 0 || n_draft < 1) return {};
  const int64_t to = std::min(size, pos_ + n_draft);
  return {prediction_.begin() + pos_, prediction_.begin() + to};
}

}  // namespace ember
