// engine/draft_lookup.h: drafts copied from text the request already has — its own prompt and
// output (prompt lookup, "--spec ngram") or the output its caller predicted (OpenAI's
// Predicted Outputs). Pure token matching: no model, no engine state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ember {

// Prompt lookup: finds the longest suffix of `history` (n_max down to n_min tokens) that also
// occurs earlier in it, takes the most recent such occurrence and returns the tokens that
// followed it (at most n_draft). Empty when nothing matches. n_matched, if given, is set to
// the length of the suffix that matched (0 when none did).
std::vector<int32_t> ngram_drafts(std::span<const int32_t> history, int n_min, int n_max, int64_t n_draft,
                                  int64_t* n_matched = nullptr);

// Where a request's output stands in its prediction, kept across steps. While the output
// follows the prediction the cursor just advances; where it departs (an edited line), the
// cursor is lost until the output's last tokens are found in the prediction again — first
// after the point of departure (edits move forward), else anywhere.
class PredictionCursor {
 public:
  PredictionCursor() = default;
  explicit PredictionCursor(std::vector<int32_t> prediction) : prediction_(std::move(prediction)) {}

  // The next (at most n_draft) tokens of the prediction for an output that is now `output`
  // (the previous call's output plus what was appended since).
  std::vector<int32_t> drafts(std::span<const int32_t> output, int64_t n_draft);
  // How many of the output's last tokens agree with the prediction where the cursor stands (as
  // of the last drafts() call): the suffix a realignment matched, plus every token followed
  // since; 0 while lost. A long run means the next drafts are likely right, a fresh short match
  // (one common token) that they are often wrong.
  int64_t n_matched() const { return n_matched_; }

 private:
  void realign(std::span<const int32_t> output);

  std::vector<int32_t> prediction_;
  int64_t n_seen_ = 0;   // output tokens the cursor has followed
  int64_t pos_ = 0;      // prediction index of the token expected next; -1 while lost
  int64_t lost_at_ = 0;  // prediction index where the output last departed from it
  int64_t n_matched_ = 0;
};

}  // namespace ember
