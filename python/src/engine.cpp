// engine.cpp: bindings for cpp/engine — ember._core.Engine (a model served by the continuous-
// batching engine loop), its request handles and token events. The loop runs on its own C++
// thread; Python submits, cancels and reads events with the GIL released around every wait.
// Each request handle owns an eventfd (a pipe where there is none) the engine writes to on
// every event, so asyncio can watch it with loop.add_reader.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fcntl.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/eventfd.h>
#endif

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/model_engine.h"
#include "kv/paged_kv_cache.h"

namespace nb = nanobind;
using ember::EngineStats;
using ember::FinishReason;
using ember::TokenEvent;

namespace {

// A wake-up file descriptor: readable after signal(), until clear(). Shared by a request handle
// and the engine's notify hook, so it stays open while either may touch it.
class WakeFd {
 public:
  WakeFd() {
#if defined(__linux__)
    read_fd_ = write_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (read_fd_ < 0) throw ember::Error(ember::cat("[engine] eventfd failed: errno ", errno));
#else
    int fds[2];
    if (pipe(fds) != 0) throw ember::Error(ember::cat("[engine] pipe failed: errno ", errno));
    for (int fd : fds) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
#endif
  }
  ~WakeFd() {
    close(read_fd_);
    if (write_fd_ != read_fd_) close(write_fd_);
  }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fileno() const { return read_fd_; }
  void signal() const noexcept {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(write_fd_, &one, read_fd_ == write_fd_ ? sizeof(one) : 1);
  }
  void clear() const noexcept {
    uint64_t buf[8];
    while (read(read_fd_, buf, sizeof(buf)) > 0) {
    }
  }

 private:
  int read_fd_ = -1, write_fd_ = -1;
};

// What Python holds for one submitted request.
struct PyRequest {
  ember::RequestId id = 0;
  std::shared_ptr<ember::EventQueue> events;
  std::shared_ptr<WakeFd> wake;
  bool done = false;  // the final event was handed out
};

struct PyEngine {
  std::shared_ptr<ember::Model> model;
  std::unique_ptr<ember::Engine> engine;
  ember::EngineConfig config;
  ember::DType kv_type = ember::DType::f16;
};

std::optional<std::string> finish_reason(const TokenEvent& e) {
  if (e.finish_reason == FinishReason::none) return std::nullopt;
  return std::string(ember::to_string(e.finish_reason));
}

// Hands out the events taken from the queue; notes the end of the stream.
std::vector<TokenEvent> deliver(PyRequest& r, std::vector<TokenEvent> events) {
  for (const TokenEvent& e : events) r.done |= e.finished();
  return events;
}

std::vector<TokenEvent> next_events(PyRequest& r, std::optional<double> timeout_s) {
  if (r.done) return {};
  using Clock = std::chrono::steady_clock;
  const auto deadline = timeout_s
                            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(std::max(0.0, *timeout_s)))
                            : Clock::time_point::max();
  // Waits in slices so Ctrl-C reaches Python while a caller blocks without a timeout.
  constexpr auto kSlice = std::chrono::milliseconds(100);
  while (true) {
    std::vector<TokenEvent> out;
    {
      nb::gil_scoped_release release;
      const auto left = deadline - Clock::now();
      const auto wait = std::min<Clock::duration>(std::max<Clock::duration>(left, Clock::duration::zero()),
                                                  kSlice);
      if (auto first = r.events->pop(std::chrono::duration_cast<std::chrono::milliseconds>(wait))) {
        out.push_back(std::move(*first));
        for (TokenEvent& e : r.events->drain()) out.push_back(std::move(e));
      }
    }
    if (!out.empty()) return deliver(r, std::move(out));
    if (Clock::now() >= deadline) return {};
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

nb::dict stats_dict(const EngineStats& s) {
  nb::dict d;
  d["running"] = s.n_running;
  d["waiting"] = s.n_waiting;
  d["kv_usage"] = s.kv_usage;
  d["prefix_query_tokens"] = s.n_prefix_query_tokens;
  d["prefix_hit_tokens"] = s.n_prefix_hit_tokens;
  d["prompt_tokens_total"] = s.n_prompt_tokens_total;
  d["generation_tokens_total"] = s.n_generation_tokens_total;
  d["preemptions"] = s.n_preemptions;
  d["steps"] = s.n_steps;
  nb::dict drafted, accepted;
  for (int i = 1; i < ember::kNumDraftSources; ++i) {
    const std::string name(ember::to_string(static_cast<ember::DraftSource>(i)));
    drafted[name.c_str()] = s.speculation.n_drafted[i];
    accepted[name.c_str()] = s.speculation.n_accepted[i];
  }
  d["drafted_tokens"] = drafted;
  d["accepted_tokens"] = accepted;
  d["step_fixed_s"] = s.step_fixed_s;
  d["step_per_row_s"] = s.step_per_row_s;
  d["draft_fixed_s"] = s.draft_fixed_s;
  d["draft_per_row_s"] = s.draft_per_row_s;
  return d;
}

PyEngine* make_engine(const std::string& path, std::optional<int> n_threads, std::optional<int64_t> n_ctx,
                      int parallel, std::optional<int64_t> kv_size, std::optional<int64_t> kv_bytes,
                      int block_size, int64_t max_batch_tokens, int64_t max_queue, const std::string& kv_type,
                      bool prefix_caching, bool batch_invariant, const std::string& spec,
                      std::optional<std::string> draft_model, int draft_max, int draft_min,
                      bool spec_adaptive, const std::string& device) {
  auto self = std::make_unique<PyEngine>();
  nb::gil_scoped_release release;
  ember::ModelEngineOptions o;
  o.n_ctx = n_ctx.value_or(0);
  o.max_num_seqs = parallel;
  o.kv_tokens = kv_size.value_or(0);
  o.kv_bytes = kv_bytes.value_or(0);
  o.block_size = block_size;
  o.max_num_batched_tokens = max_batch_tokens;
  o.max_queue = max_queue;
  o.kv_type = kv_type;
  o.enable_prefix_caching = prefix_caching;
  o.rows_independent = batch_invariant;
  if (spec == "none") {
    o.speculation.source = draft_model ? ember::DraftSource::draft_model : ember::DraftSource::none;
  } else if (spec == "ngram") {
    o.speculation.source = ember::DraftSource::ngram;
  } else if (spec == "draft") {
    if (!draft_model)
      throw ember::InvalidArgument("[speculation] spec 'draft' needs a draft model (draft_model)");
    o.speculation.source = ember::DraftSource::draft_model;
  } else {
    throw ember::InvalidArgument(
        ember::cat("[speculation] spec must be 'none', 'ngram' or 'draft', got '", spec, "'"));
  }
  if (draft_model && o.speculation.source != ember::DraftSource::draft_model) {
    throw ember::InvalidArgument(
        ember::cat("[speculation] a draft model drafts only with spec 'draft', got '", spec, "'"));
  }
  o.speculation.draft_max = draft_max;
  o.speculation.draft_min = draft_min;
  o.speculation.adaptive = spec_adaptive;
  ember::ModelOptions model_options;
  model_options.n_threads = n_threads.value_or(0);
  model_options.backend = device;
  self->model = ember::Model::load(path, model_options);
  self->config = ember::model_engine_config(*self->model, o);  // checks before any allocation
  self->kv_type = ember::model_engine_kv_type(*self->model, o.kv_type);
  std::shared_ptr<ember::Model> draft;
  if (draft_model) draft = ember::Model::load_on(*draft_model, *self->model);
  self->engine = ember::make_model_engine(self->model, o, draft);
  return self.release();
}

PyRequest submit(PyEngine& self, const std::vector<int64_t>& prompt, const ember::SamplingParams& sampling,
                 int64_t max_tokens, const std::vector<int64_t>& stop_token_ids, int32_t logprobs,
                 int priority, std::shared_ptr<ember::Grammar> grammar,
                 const std::vector<int64_t>& prediction) {
  const auto to_id = [](int64_t id, const char* what) {
    if (id < INT32_MIN || id > INT32_MAX)
      throw ember::InvalidArgument(ember::cat("[request] ", what, " id ", id, " is out of range"));
    return static_cast<int32_t>(id);
  };
  std::vector<int32_t> tokens(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) tokens[i] = to_id(prompt[i], "prompt token");
  ember::RequestOptions o;
  o.max_tokens = max_tokens;
  o.priority = priority;
  for (int64_t t : stop_token_ids) o.stop_token_ids.push_back(to_id(t, "stop token"));
  o.sampling = sampling;
  o.n_logprobs = logprobs;
  o.grammar = std::move(grammar);
  for (int64_t t : prediction) o.prediction.push_back(to_id(t, "prediction token"));

  PyRequest r;
  r.wake = std::make_shared<WakeFd>();
  {
    nb::gil_scoped_release release;
    std::shared_ptr<WakeFd> wake = r.wake;
    ember::Engine::Submission s = self.engine->submit(std::move(tokens), std::move(o),
                                                      [wake] { wake->signal(); });
    r.id = s.id;
    r.events = std::move(s.events);
  }
  return r;
}

}  // namespace

void init_engine(nb::module_& m) {
  nb::exception<ember::EngineBusy>(m, "EngineBusy", m.attr("EmberError").ptr());

  nb::class_<TokenEvent>(m, "TokenEvent", "One thing that happened to a request: a token and/or its end.")
      .def_ro("id", &TokenEvent::id)
      .def_prop_ro(
          "token",
          [](const TokenEvent& e) -> std::optional<int32_t> {
            if (!e.has_token()) return std::nullopt;
            return e.token;
          },
          "The sampled token id, or None (an end without a token: cancelled, error).")
      .def_prop_ro("finish_reason", &finish_reason,
                   "None while more events follow; else 'stop' (a stop token, which is this event's "
                   "token), 'length', 'cancelled' or 'error'.")
      .def_ro("error", &TokenEvent::error)
      .def_ro("n_prompt_tokens", &TokenEvent::n_prompt_tokens)
      .def_ro("n_output_tokens", &TokenEvent::n_output_tokens)
      .def_ro("n_cached_tokens", &TokenEvent::n_cached_tokens,
              "Prompt tokens whose KV came from the prefix cache.")
      .def_ro("n_drafted_tokens", &TokenEvent::n_drafted_tokens,
              "Speculative drafts of the request verified so far.")
      .def_ro("n_accepted_tokens", &TokenEvent::n_accepted_tokens,
              "Of n_drafted_tokens, those accepted (they are part of the output).")
      .def_prop_ro(
          "logprobs",
          [](const TokenEvent& e) -> std::optional<std::pair<float, std::vector<std::pair<int32_t, float>>>> {
            if (!e.has_logprobs) return std::nullopt;
            return std::make_pair(e.logprobs.logprob, e.logprobs.top);
          },
          "(logprob of token, [(id, logprob)] most likely first) when the request asked, else None.")
      .def("__repr__", [](const TokenEvent& e) {
        return ember::cat("TokenEvent(id=", e.id, ", token=", e.token,
                          ", finish_reason=", ember::to_string(e.finish_reason),
                          ", n_output_tokens=", e.n_output_tokens, ")");
      });

  nb::class_<PyRequest>(m, "EngineRequest",
                        "A submitted request: its id and its stream of TokenEvents (the last one has "
                        "a finish_reason).")
      .def_ro("id", &PyRequest::id)
      .def_ro("done", &PyRequest::done, "The final event has been handed out.")
      .def(
          "fileno", [](const PyRequest& r) { return r.wake->fileno(); },
          "A file descriptor that becomes readable when events arrive (for loop.add_reader); "
          "drain() clears it.")
      .def("next_events", &next_events, nb::arg("timeout") = nb::none(),
           "Waits (GIL released) up to `timeout` seconds (None: as long as it takes) for at least one "
           "event and returns every event available; [] on timeout or after the last event.")
      .def(
          "drain",
          [](PyRequest& r) {
            r.wake->clear();
            return deliver(r, r.events->drain());
          },
          "Every event available now, without waiting; clears fileno()'s readiness first.");

  nb::class_<PyEngine>(m, "Engine",
                       "A GGUF model served by the continuous-batching engine: a C++ thread runs every "
                       "submitted request in shared batched steps over a paged KV cache with prefix "
                       "caching. Thread-safe.")
      .def(nb::new_(&make_engine), nb::arg("model_path"), nb::kw_only(), nb::arg("n_threads") = nb::none(),
           nb::arg("n_ctx") = nb::none(), nb::arg("parallel") = 16, nb::arg("kv_size") = nb::none(),
           nb::arg("kv_bytes") = nb::none(), nb::arg("block_size") = 16, nb::arg("max_batch_tokens") = 512,
           nb::arg("max_queue") = 0, nb::arg("kv_type") = "f16", nb::arg("prefix_caching") = true,
           nb::arg("batch_invariant") = true, nb::arg("spec") = "none", nb::arg("draft_model") = nb::none(),
           nb::arg("draft_max") = ember::SpeculationConfig().draft_max,
           nb::arg("draft_min") = ember::SpeculationConfig().draft_min, nb::arg("spec_adaptive") = true,
           nb::arg("device") = "auto",
           "Loads the model and starts the engine thread. n_ctx: tokens one request may reach (default "
           "min(context_length, 4096)); parallel: requests running at once; kv_size / kv_bytes: the KV "
           "cache budget in tokens or bytes (default n_ctx * parallel tokens, at most 1 GiB); "
           "max_batch_tokens: tokens per step (prompts are chunked to fit); max_queue: waiting "
           "requests at most (0: no limit; past it submit raises EngineBusy); kv_type: 'f16' or 'q8_0' (K/V "
           "rows quantized to 8 bits in blocks of 32: 34 bytes per 32 values instead of 64, so a byte "
           "budget holds ~1.9x the tokens, at slightly less exact attention; needs head_dim % 32 == 0); "
           "batch_invariant: a request's "
           "output never depends on what else runs (small batches are padded, attention runs one row "
           "at a time; False is a little faster but lets kernel rounding differ with the batch). "
           "Speculation: spec 'ngram' drafts from each request's own text (prompt lookup), 'draft' "
           "(or a draft_model path) from a small model of the same vocabulary; requests with a "
           "prediction draft from it whatever spec says. draft_max / draft_min: drafts per request "
           "and step at most / at least; spec_adaptive: draft only as deep as the measured step cost "
           "says pays (False: always draft_max); device: 'cpu', 'vulkan' / 'vulkan:N', or 'auto' (the "
           "first GPU, else the CPU).")
      .def("submit", &submit, nb::arg("prompt_tokens"), nb::arg("sampling") = ember::SamplingParams(),
           nb::kw_only(), nb::arg("max_tokens") = ember::RequestOptions().max_tokens,
           nb::arg("stop_token_ids") = std::vector<int64_t>{}, nb::arg("logprobs") = -1,
           nb::arg("priority") = 0, nb::arg("grammar") = nb::none(),
           nb::arg("prediction") = std::vector<int64_t>{},
           "Queues a request and returns its EngineRequest. Raises ValueError for a request that can "
           "never run (empty or too long prompt, bad ids or sampling values) and EngineBusy when the "
           "queue is full. `sampling` is a SamplingParams; logprobs >= 0 adds the chosen token's "
           "log-probability and that many alternatives to each event; `grammar` (a Grammar) constrains "
           "every output token to it; prediction: token ids of the output the caller expects "
           "(OpenAI's Predicted Outputs), drafted from (the output stays the same).")
      .def(
          "cancel", [](PyEngine& self, ember::RequestId id) { self.engine->cancel(id); }, nb::arg("id"),
          "Ends a request (its stream gets a 'cancelled' event) and frees its KV blocks; unknown or "
          "finished ids are ignored.")
      .def(
          "stats", [](const PyEngine& self) { return stats_dict(self.engine->stats()); },
          "{running, waiting, kv_usage (fraction of blocks referenced), prefix_query_tokens, "
          "prefix_hit_tokens, prompt_tokens_total, generation_tokens_total, preemptions, steps}")
      .def(
          "shutdown",
          [](PyEngine& self) {
            nb::gil_scoped_release release;
            self.engine->shutdown();
          },
          "Stops the engine thread; unfinished requests end 'cancelled', later submits raise EngineBusy.")
      .def_prop_ro("n_vocab", [](const PyEngine& self) { return self.model->config().n_vocab; })
      .def_prop_ro(
          "n_ctx", [](const PyEngine& self) { return self.engine->max_model_len(); },
          "Tokens one request may reach (prompt and output).")
      .def_prop_ro("parallel", [](const PyEngine& self) { return self.config.scheduler.max_num_seqs; })
      .def_prop_ro("block_size", [](const PyEngine& self) { return self.config.kv.block_size; })
      .def_prop_ro("n_blocks", [](const PyEngine& self) { return self.config.kv.n_blocks; })
      .def_prop_ro(
          "kv_size", [](const PyEngine& self) { return self.config.kv.n_blocks * self.config.kv.block_size; },
          "Tokens the KV cache holds.")
      .def_prop_ro(
          "kv_bytes_per_token",
          [](const PyEngine& self) {
            const ember::ModelConfig& c = self.model->config();
            return ember::PagedKVCache::bytes_per_token(c.n_layer, c.n_kv_dim(), self.kv_type);
          },
          "Bytes one token's K and V take over all layers (in kv_type).")
      .def_prop_ro("max_batch_tokens",
                   [](const PyEngine& self) { return self.config.scheduler.max_num_batched_tokens; })
      .def_prop_ro("n_threads", [](const PyEngine& self) { return self.model->backend().n_threads(); })
      .def_prop_ro(
          "device", [](const PyEngine& self) { return self.model->backend().device_name(); },
          "The device the model runs on: 'cpu', or e.g. 'vulkan:0 (AMD Radeon ...)'.")
      .def_prop_ro(
          "device_memory",
          [](const PyEngine& self) -> std::optional<std::pair<int64_t, int64_t>> {
            const std::optional<ember::DeviceMemory> m = self.model->backend().device_memory();
            if (!m) return std::nullopt;
            return std::make_pair(m->total_bytes, m->free_bytes);
          },
          "(total, free) bytes of the device's memory; None on the CPU.")
      .def_prop_ro(
          "device_submissions", [](const PyEngine& self) { return self.model->backend().n_submissions(); },
          "Command submissions to the device so far (one per engine step that ran; 0 on the CPU).")
      .def_prop_ro(
          "kv_type", [](const PyEngine& self) { return std::string(ember::dtype_name(self.kv_type)); },
          "The KV cache's element type: 'f16' or 'q8_0'.");
}
