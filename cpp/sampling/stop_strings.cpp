// sampling/stop_strings.cpp: stop-string search over a small held-back buffer.
// Invariant: pending_ is always shorter than the longest stop string, so each push scans
// O(piece + longest stop) bytes.
#include "sampling/stop_strings.h"

#include <algorithm>

namespace ember {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view piece) {
  if (stopped_) return {"", true, ""};
  pending_.append(piece);

  // The earliest complete stop string wins; among those starting at the same place, the first listed.
  size_t stop_at = std::string::npos;
  const std::string* found = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < stop_at) {
      stop_at = at;
      found = &s;
    }
  }
  if (found != nullptr) {
    stopped_ = true;
    Result r{pending_.substr(0, stop_at), true, *found};
    pending_.clear();
    return r;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string. The suffix starts
  // where a stop string's first byte matched, which is a character boundary in whole UTF-8, so
  // the emitted part stays whole UTF-8 too.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t longest = std::min(s.size() - 1, pending_.size());
    for (size_t len = longest; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  Result r{pending_.substr(0, pending_.size() - hold), false, ""};
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace ember
