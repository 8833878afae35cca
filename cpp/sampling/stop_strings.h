// sampling/stop_strings.h: finds stop strings in streamed text. Text that might be the start of
// a stop string is held back until the next piece settles it, so a stop string is never
// emitted, not even in part, however the tokens split it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ember {

class StopStringMatcher {
 public:
  // Empty strings are ignored.
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;  // safe to emit now
    bool stopped;      // a stop string was found; `text` ends right before it
    std::string stop;  // the stop string found ("" if none)
  };

  // Appends a piece of text (whole UTF-8) and returns what can be emitted. After a stop,
  // further pushes return nothing.
  Result push(std::string_view piece);

  // The text held back (generation ended without a stop string), and starts over.
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // a suffix of the text so far that is a proper prefix of a stop string
  bool stopped_ = false;
};

}  // namespace ember
