// engine/event_queue.h: the per-request stream of results from the engine thread to whoever
// waits for them (a Python thread with the GIL released, an asyncio reader woken through the
// notify hook, a C++ caller). One producer (the engine thread), any number of consumers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "sampling/logprobs.h"

namespace ember {

// One thing that happened to a request: a token, possibly with the end; or only the end
// (cancelled, failed). Text-free: detokenizing is the consumer's business.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;                               // -1 when the event carries no token
  FinishReason finish_reason = FinishReason::none;  // none: more events follow
  std::string error;                                // why, when finish_reason == error
  int64_t n_prompt_tokens = 0;
  int64_t n_output_tokens = 0;    // so far, this token included
  int64_t n_cached_tokens = 0;    // prompt tokens served by the prefix cache
  int64_t n_drafted_tokens = 0;   // speculative drafts of the request verified so far
  int64_t n_accepted_tokens = 0;  // of them, accepted (part of the output)
  bool has_logprobs = false;      // the request asked for them and a token came
  TokenLogprobs logprobs{};       // of `token` (and the top alternatives)

  bool finished() const { return finish_reason != FinishReason::none; }
  bool has_token() const { return token >= 0; }
};

class EventQueue {
 public:
  // `notify` (may be empty) runs on the producer's thread after each push, without the lock
  // held; it must be quick and must not throw (e.g. write to an eventfd).
  explicit EventQueue(std::function<void()> notify = {}) : notify_(std::move(notify)) {}

  void push(TokenEvent event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_all();
    if (notify_) notify_();
  }

  // The next event, waiting up to `timeout` for one; nullopt on timeout.
  std::optional<TokenEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    TokenEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  // The next event, waiting as long as it takes (the engine always ends a request with one).
  TokenEvent pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !events_.empty(); });
    TokenEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  // Every event available now, without waiting (an asyncio reader drains on each wake-up).
  std::vector<TokenEvent> drain() {
    std::lock_guard lock(mutex_);
    std::vector<TokenEvent> out(std::make_move_iterator(events_.begin()),
                                std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<TokenEvent> events_;
  std::function<void()> notify_;
};

}  // namespace ember
