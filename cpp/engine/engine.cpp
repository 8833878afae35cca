// engine/engine.cpp: the loop thread, its inboxes and the per-request event streams.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "engine/batch_builder.h"
#include "kv/state_file.h"

namespace ember {

Engine::Engine(const EngineConfig& config, std::unique_ptr<ModelRunner> runner,
               std::unique_ptr<DraftModel> draft_model)
    : kv_(config.kv),
      scheduler_(config.scheduler, kv_),
      runner_(std::move(runner)),
      speculator_(config.speculation, std::move(draft_model)),
      max_queue_(config.max_queue),
      max_live_(config.max_queue > 0 ? config.scheduler.parallel + config.max_queue : 0),
      max_model_len_(scheduler_.max_model_len()),
      block_layout_(config.block_layout) {
  if (!runner_) throw InvalidArgument("[engine] no model runner");
  if (config.max_queue < 0)
    throw InvalidArgument(cat("[engine] max_queue must be >= 0, got ", config.max_queue));
  publish_stats();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (DiskCache* disk = kv_.disk()) disk->flush();  // a restart finds every block written
}

Engine::Submission Engine::submit(std::vector<int32_t> prompt, RequestOptions options,
                                  std::function<void()> notify) {
  validate(prompt, options);
  auto events = std::make_shared<EventQueue>(std::move(notify));
  RequestId id;
  {
    std::lock_guard lock(mutex_);
    if (stop_) throw EngineBusy("[engine] the engine has shut down");
    // The queue is what the slots cannot hold: counted from the live requests, not from the
    // scheduler's waiting list, which still holds the requests a step is admitting to free
    // slots (until the step ends: the longest one, a batch of prefills) and those a step's token
    // budget left for the next one.
    if (max_live_ > 0 && n_live_ >= max_live_) {
      throw EngineBusy(cat("[engine] ", n_live_ - (max_live_ - max_queue_),
                           " requests wait for a slot, the queue holds ", max_queue_));
    }
    ++n_live_;
    id = next_id_++;
    Request request(id, prompt, std::move(options));
    request.cache_namespace = runner_->cache_namespace(request.options);
    inbox_.push_back({std::move(request), events});
  }
  wake_.notify_all();
  return {id, std::move(events)};
}

void Engine::validate(std::span<const int32_t> prompt, const RequestOptions& options) const {
  scheduler_.validate(prompt, options);  // reads only immutable config
  runner_->validate(prompt, options);    // likewise
}

void Engine::cancel(RequestId id) {
  {
    std::lock_guard lock(mutex_);
    cancel_inbox_.push_back(id);
  }
  wake_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s = stats_;
  s.n_waiting += static_cast<int64_t>(inbox_.size());
  return s;
}

void Engine::publish_stats() {
  EngineStats s;
  s.n_running = scheduler_.n_running();
  s.n_waiting = scheduler_.n_waiting();
  s.kv_usage = kv_.usage();
  s.n_prefix_query_tokens = kv_.n_prefix_query_tokens();
  s.n_prefix_hit_tokens = kv_.n_prefix_hit_tokens();
  s.n_disk_hit_tokens = kv_.n_disk_hit_tokens();
  if (const DiskCache* disk = kv_.disk()) s.disk = disk->stats();
  s.n_prompt_tokens_total = n_prompt_tokens_total_;
  s.n_generation_tokens_total = n_generation_tokens_total_;
  s.n_preemptions = scheduler_.n_preemptions();
  s.n_steps = n_steps_;
  s.n_images_encoded = runner_->n_images_encoded();
  s.speculation = speculator_.stats();
  s.step_fixed_s = speculator_.cost().fixed_s();
  s.step_per_row_s = speculator_.cost().per_row_s();
  if (const DraftModel* d = speculator_.draft_model()) {
    s.draft_fixed_s = d->cost().fixed_s();
    s.draft_per_row_s = d->cost().per_row_s();
  }
  std::lock_guard lock(mutex_);
  stats_ = s;
}

void Engine::loop() {
  while (true) {
    std::vector<Pending> arrived;
    std::vector<RequestId> cancelled;
    std::vector<std::function<void()>> tasks;
    bool stop;
    {
      std::unique_lock lock(mutex_);
      if (!scheduler_.has_unfinished()) {
        wake_.wait(lock,
                   [&] { return stop_ || !inbox_.empty() || !cancel_inbox_.empty() || !tasks_.empty(); });
      }
      tasks.swap(tasks_);
      arrived.swap(inbox_);
      // They wait in the scheduler from here on: counted now, or stats() would see them in
      // neither place until publish_stats() recounts after the step.
      stats_.n_waiting += static_cast<int64_t>(arrived.size());
      cancelled.swap(cancel_inbox_);
      stop = stop_;
    }
    for (Pending& p : arrived) {
      const RequestId id = p.request.id;
      const int64_t n_prompt = p.request.n_prompt_tokens;
      streams_.emplace(id, std::move(p.events));
      try {
        const RequestOptions options = p.request.options;
        scheduler_.add_request(std::move(p.request));
        runner_->add(id, options);
        n_prompt_tokens_total_ += n_prompt;
      } catch (const Error& e) {  // validated in submit(); kept for safety
        end_request(id, FinishReason::error, e.what());
      }
    }
    for (RequestId id : cancelled) end_request(id, FinishReason::cancelled, "");
    for (auto& task : tasks) task();  // before a stop too: their callers wait
    if (stop) {
      std::vector<RequestId> live;
      for (const auto& [id, stream] : streams_) live.push_back(id);
      for (RequestId id : live) end_request(id, FinishReason::cancelled, "");
      release_finished();
      publish_stats();
      return;
    }
    if (scheduler_.has_unfinished()) step();
    release_finished();
    publish_stats();
  }
}

void Engine::step() {
  speculator_.propose(scheduler_);
  const StepPlan plan = scheduler_.schedule();
  // Requests cancelled since the last step (release_finished() took the rest).
  if (!plan.finished.empty()) release(plan.finished);
  if (plan.empty()) {
    // Work is left but nothing fits: only possible while requests wait on each other's blocks
    // for a moment; don't spin hot.
    std::this_thread::yield();
    return;
  }
  std::vector<RequestOutput> outputs;
  std::vector<SampledTokens> sampled;
  try {
    const Batch batch = build_batch(plan, scheduler_);
    const auto start = std::chrono::steady_clock::now();
    sampled = runner_->execute(batch);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    speculator_.observe(plan, sampled, took.count());
    speculator_.catch_up(plan, scheduler_);
    outputs = scheduler_.update_from_output(plan, sampled);
    save_to_disk();
  } catch (const std::exception& e) {
    // The step's requests can't trust their cache any more: fail them, keep serving the rest.
    for (const ScheduledSequence& s : plan.seqs) {
      end_request(s.id, FinishReason::error, cat("[engine] the model runner failed: ", e.what()));
    }
    ++n_steps_;
    return;
  }
  ++n_steps_;
  // Outputs come in plan order, each request's tokens in a row: the j-th output of a request
  // is the j-th token of its SampledTokens.
  std::unordered_map<RequestId, const SampledTokens*> sampled_of;
  size_t k = 0;
  for (const ScheduledSequence& s : plan.seqs) {
    if (s.needs_sample) sampled_of.emplace(s.id, &sampled[k++]);
  }
  RequestId current = -1;
  size_t j = 0;
  for (const RequestOutput& out : outputs) {
    j = out.id == current ? j + 1 : 0;
    current = out.id;
    const SampledTokens* got = sampled_of.at(out.id);
    emit(out, j < got->logprobs.size() ? &got->logprobs[j] : nullptr);
  }
}

// The blocks this step registered go to the disk cache: their rows are copied here (the next
// step may overwrite them), the files are written by the cache's own thread.
void Engine::save_to_disk() {
  DiskCache* disk = kv_.disk();
  if (!disk) return;
  std::vector<BlockSave> saves = kv_.take_block_saves();
  if (saves.empty()) return;
  std::vector<BlockId> blocks;
  for (const BlockSave& s : saves) blocks.push_back(s.block);
  std::vector<std::vector<uint8_t>> payloads = runner_->read_blocks(blocks);
  for (size_t i = 0; i < saves.size(); ++i) {
    if (payloads[i].empty()) continue;  // a runner without K/V (tests' fake)
    disk->write(saves[i].hash, saves[i].parent_hash, std::move(saves[i].tokens), std::move(payloads[i]));
  }
}

void Engine::run_on_loop(std::function<void()> task) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  {
    std::lock_guard lock(mutex_);
    if (stop_) throw EngineBusy("[engine] the engine has shut down");
    tasks_.push_back([task = std::move(task), done] {
      try {
        task();
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  wake_.notify_all();
  finished.get();
}

Engine::StateIO Engine::save_state(std::vector<int32_t> tokens, const std::string& path) {
  PrefixState state;
  run_on_loop([&] {
    for (std::vector<uint8_t>& payload : runner_->read_blocks(kv_.cached_prefix(tokens))) {
      if (payload.empty()) break;  // a runner without K/V (tests' fake)
      state.blocks.push_back(std::move(payload));
    }
  });
  state.tokens = std::move(tokens);
  StateIO io;
  io.n_bytes = write_state_file(path, block_layout_, state);
  io.n_tokens = static_cast<int64_t>(state.blocks.size()) * kv_.block_size();
  io.tokens = std::move(state.tokens);
  return io;
}

Engine::StateIO Engine::load_state(const std::string& path) {
  StateIO io;
  PrefixState state = read_state_file(path, block_layout_, &io.n_bytes);
  run_on_loop([&] {
    std::vector<std::pair<int64_t, BlockId>> to_write;
    std::vector<BlockId> held;
    const int64_t n_blocks = kv_.adopt_prefix(state.tokens, static_cast<int64_t>(state.blocks.size()),
                                              to_write, held);
    std::vector<BlockLoad> loads;
    for (const auto& [i, block] : to_write) {
      loads.push_back({block, std::make_shared<const std::vector<uint8_t>>(std::move(state.blocks[i]))});
    }
    runner_->write_blocks(loads);
    kv_.release_adopted(held);
    io.n_restored = n_blocks * kv_.block_size();
  });
  io.n_tokens = static_cast<int64_t>(state.blocks.size()) * kv_.block_size();
  io.tokens = std::move(state.tokens);
  return io;
}

void Engine::release(std::span<const RequestId> ids) {
  runner_->release(ids);
  speculator_.release(ids);
}

// Tells the runner at once which requests left (finished, cancelled, failed), so it never holds
// their state while the loop sleeps.
void Engine::release_finished() {
  const std::vector<RequestId> ids = scheduler_.take_finished();
  if (!ids.empty()) release(ids);
}

void Engine::emit(const RequestOutput& out, const TokenLogprobs* logprobs) {
  const auto it = streams_.find(out.id);
  if (it == streams_.end()) return;
  ++n_generation_tokens_total_;
  TokenEvent e{.id = out.id,
               .token = out.token,
               .finish_reason = out.finish_reason,
               .error = {},
               .n_prompt_tokens = out.n_prompt_tokens,
               .n_output_tokens = out.n_output_tokens,
               .n_cached_tokens = out.n_cached_tokens,
               .n_drafted_tokens = out.n_drafted_tokens,
               .n_accepted_tokens = out.n_accepted_tokens,
               .has_logprobs = logprobs != nullptr,
               .logprobs = logprobs ? *logprobs : TokenLogprobs{}};
  if (out.finished()) {
    end_stream(it, std::move(e));
  } else {
    it->second->push(std::move(e));
  }
}

// The request leaves the queue's count before its final event is out: a client that sends its
// next request on reading it must find the room it made.
void Engine::end_stream(std::unordered_map<RequestId, std::shared_ptr<EventQueue>>::iterator it,
                        TokenEvent e) {
  {
    std::lock_guard lock(mutex_);
    --n_live_;
  }
  it->second->push(std::move(e));
  streams_.erase(it);
}

// Finishes a live request now (freeing its blocks) and ends its stream with an event that
// carries no token. Unknown or already finished ids are ignored.
void Engine::end_request(RequestId id, FinishReason reason, const std::string& error) {
  const auto it = streams_.find(id);
  if (it == streams_.end()) return;
  TokenEvent e;
  e.id = id;
  e.finish_reason = reason;
  e.error = error;
  if (const Request* r = scheduler_.find(id)) {
    e.n_prompt_tokens = r->n_prompt_tokens;
    e.n_output_tokens = r->n_output_tokens();
    e.n_cached_tokens = std::max<int64_t>(0, r->n_cached_tokens);
    e.n_drafted_tokens = r->n_drafted_tokens;
    e.n_accepted_tokens = r->n_accepted_tokens;
    scheduler_.cancel(id, reason);
  }
  end_stream(it, std::move(e));
}

}  // namespace ember
