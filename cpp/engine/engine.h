// engine/engine.h: the engine loop — one C++ thread that owns the scheduler, the KV cache
// manager and the model runner, and turns submitted prompts into per-request token events.
// Any thread may submit, cancel and read stats; only the loop thread touches the scheduler,
// the KV manager and the runner, so those need no locks. The loop never touches Python.
//
// One step: drain submissions and cancellations -> Speculator::propose() (drafts for decoding
// requests) -> Scheduler::schedule() -> build_batch() -> ModelRunner::execute() (verifies the
// drafts) -> Scheduler::update_from_output() -> one TokenEvent per new token (the last one of a
// request carries its finish reason). Idle, the thread sleeps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/event_queue.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/speculator.h"
#include "kv/kv_cache_manager.h"

namespace ember {

// The waiting queue is full (the server answers 503), or the engine has shut down.
class EngineBusy : public Error {
 public:
  using Error::Error;
};

struct EngineConfig {
  KVCacheConfig kv;
  SchedulerConfig scheduler;
  SpeculationConfig speculation;
  int64_t max_queue = EngineOptions{}.max_queue;  // requests beyond the scheduler's `parallel`
                                                  // slots at most; 0: no limit ("--max-queue")
  // What state files (and the disk cache's files) must match: the model and its K/V shape.
  DiskCacheLayout block_layout;
};

// A snapshot taken after each step (for /metrics and /slots).
struct EngineStats {
  int64_t n_running = 0;
  int64_t n_waiting = 0;  // queued in the scheduler or not yet picked up
  double kv_usage = 0.0;  // fraction of KV blocks referenced
  int64_t n_prefix_query_tokens = 0;
  int64_t n_prefix_hit_tokens = 0;
  int64_t n_disk_hit_tokens = 0;          // of them, read from the disk cache
  DiskCache::Stats disk;                  // the disk cache's files (all 0 without one)
  int64_t n_prompt_tokens_total = 0;      // of every request added
  int64_t n_generation_tokens_total = 0;  // tokens sampled
  int64_t n_preemptions = 0;
  int64_t n_steps = 0;
  SpeculationStats speculation;  // drafted / accepted tokens per source
  double step_fixed_s = 0.0;     // the speculator's fitted step cost: fixed + per_row * rows
  double step_per_row_s = 0.0;
  double draft_fixed_s = 0.0;  // likewise for one pass of the draft model (0 without one)
  double draft_per_row_s = 0.0;
  int64_t n_images_encoded = 0;  // by the vision encoder (ModelRunner::n_images_encoded)
};

class Engine {
 public:
  // Starts the loop thread. Throws InvalidArgument for a bad config (before any thread starts).
  // draft_model serves config.speculation.source == draft_model (may be null otherwise).
  Engine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
         std::unique_ptr<DraftModel> draft_model = nullptr);
  // Shuts down: every unfinished request gets a final `cancelled` event.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Submission {
    RequestId id = 0;
    std::shared_ptr<EventQueue> events;  // ends with an event whose finished() is true
  };
  // Queues a request. Validates it here, in the caller's thread (validate below), or throws
  // EngineBusy (queue full, engine shut down), and then queues nothing.
  // `notify` is the event queue's hook (see EventQueue).
  Submission submit(std::vector<int32_t> prompt, RequestOptions options, std::function<void()> notify = {});
  // What submit checks, without queuing: throws InvalidRequest (PromptTooLong for a prompt over
  // the context or the KV cache) or InvalidArgument (sampling values). Any thread.
  void validate(std::span<const int32_t> prompt, const RequestOptions& options) const;
  // Asks the loop to cancel a request; it frees its blocks and ends its stream with a
  // `cancelled` event. Unknown or finished ids are ignored.
  void cancel(RequestId id);
  EngineStats stats() const;

  // A state file's tokens and what of them went to or came from the file.
  struct StateIO {
    std::vector<int32_t> tokens;  // the sequence's tokens (load_state: the file's)
    int64_t n_tokens = 0;         // tokens whose K/V the file holds (whole blocks)
    int64_t n_restored = 0;       // load_state: of them, now in the prefix cache
    int64_t n_bytes = 0;          // the file's size
  };
  // Writes `tokens` and the K/V of their leading full blocks still in the prefix cache (the
  // blocks of a request that just ran) to a state file at path (kv/state_file.h). The blocks are
  // read between two steps; the file is written on the caller's thread. Throws EngineBusy after
  // shutdown, InvalidArgument when the file cannot be written.
  StateIO save_state(std::vector<int32_t> tokens, const std::string& path);
  // Reads a state file (on the caller's thread) and puts its blocks into the prefix cache
  // (between two steps), so that a prompt starting with its tokens reuses them. Throws
  // InvalidArgument naming what is wrong with a bad file (another model, corrupt, truncated).
  StateIO load_state(const std::string& path);
  // min(max_model_len, KV capacity): the longest a request may grow.
  int64_t max_model_len() const { return max_model_len_; }
  // Stops the loop (idempotent); later submissions throw EngineBusy.
  void shutdown();

 private:
  struct Pending {
    Request request;
    std::shared_ptr<EventQueue> events;
  };

  void loop();
  void step();
  void save_to_disk();
  // Runs `task` on the loop thread between two steps and waits for it; rethrows what it throws.
  void run_on_loop(std::function<void()> task);
  void emit(const RequestOutput& out, const TokenLogprobs* logprobs);
  void release(std::span<const RequestId> ids);  // tells the runner and the speculator
  void end_request(RequestId id, FinishReason reason, const std::string& error);  // cancel/fail, close stream
  // Pushes a request's final event and forgets its stream (it no longer counts against the queue).
  void end_stream(std::unordered_map<RequestId, std::shared_ptr<EventQueue>>::iterator it, TokenEvent e);
  void release_finished();
  void publish_stats();

  // Loop-thread state.
  KVCacheManager kv_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  Speculator speculator_;
  std::unordered_map<RequestId, std::shared_ptr<EventQueue>> streams_;  // live requests
  int64_t n_prompt_tokens_total_ = 0;
  int64_t n_generation_tokens_total_ = 0;
  int64_t n_steps_ = 0;

  // Shared state, under mutex_.
  const int64_t max_queue_;
  const int64_t max_live_;  // parallel + max_queue: live requests at most (0: no limit)
  int64_t n_live_ = 0;      // submitted, final event not yet pushed
  const int64_t max_model_len_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Pending> inbox_;
  std::vector<RequestId> cancel_inbox_;
  std::vector<std::function<void()>> tasks_;
  bool stop_ = false;
  EngineStats stats_;
  std::atomic<RequestId> next_id_{1};
  const DiskCacheLayout block_layout_;

  std::thread thread_;  // last: starts after everything above is built
};

}  // namespace ember
