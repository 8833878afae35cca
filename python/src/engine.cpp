// engine.cpp: bindings for cpp/engine — ember._core.Engine (a model served by the continuous-
// batching engine loop), its request handles and token events. The loop runs on its own C++
// thread; Python submits, cancels and reads events with the GIL released around every wait.
// Each request handle owns an eventfd (a pipe where there is none) the engine writes to on
// every event, so asyncio can watch it with loop.add_reader.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
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
#include "load_model.h"
#include "model/context.h"
#include "vision.h"

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
  std::vector<std::shared_ptr<const ember::LoraAdapter>> adapters;  // the engine's, in index order
  std::shared_ptr<ember::VisionModel> vision;                       // EngineOptions::mmproj's, or null
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
  d["disk_hit_tokens"] = s.n_disk_hit_tokens;
  nb::dict disk;
  disk["files"] = s.disk.n_files;
  disk["bytes"] = s.disk.n_bytes;
  disk["written"] = s.disk.n_written;
  disk["read"] = s.disk.n_read;
  disk["rejected"] = s.disk.n_rejected;
  disk["dropped"] = s.disk.n_dropped;
  disk["evicted"] = s.disk.n_evicted;
  d["disk_cache"] = disk;
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
  d["images_encoded"] = s.n_images_encoded;
  return d;
}

// EngineOptions(**fields) and Engine(path, options, **fields): `options` (else the C++ defaults),
// then each keyword set as an attribute, so a misspelt option is a TypeError and a value's type
// is checked by the attribute's setter.
ember::EngineOptions options_from(std::optional<ember::EngineOptions> options, const nb::kwargs& fields) {
  nb::object out = nb::cast(options.value_or(ember::EngineOptions()));
  for (auto [name, value] : fields) {
    if (!nb::hasattr(nb::type<ember::EngineOptions>(), name)) {
      throw nb::type_error(ember::cat("unknown engine option '", nb::cast<std::string>(name), "'").c_str());
    }
    nb::setattr(out, name, value);
  }
  return nb::cast<ember::EngineOptions>(out);
}

void init_engine_object(PyEngine* self, const std::string& path, std::optional<ember::EngineOptions> options,
                        const std::vector<std::string>& lora, const nb::kwargs& fields) {
  const ember::EngineOptions o = options_from(std::move(options), fields);
  o.check();  // before the model loads
  PyEngine engine;
  {
    nb::gil_scoped_release release;
    engine.model = load_model(path, o.n_threads, o.device);
    engine.config = ember::model_engine_config(*engine.model, o);  // checks before any allocation
    engine.kv_type = ember::model_engine_kv_type(*engine.model, o.kv_type);
    std::shared_ptr<ember::Model> draft;
    if (o.draft_model) draft = ember::Model::load_on(*o.draft_model, *engine.model);
    std::vector<std::shared_ptr<const ember::LoraAdapter>> adapters;
    for (const std::string& adapter : lora)
      adapters.push_back(ember::LoraAdapter::load(adapter, engine.model));
    engine.adapters = adapters;
    if (o.mmproj) engine.vision = ember::VisionModel::load(*o.mmproj, engine.model->shared_backend());
    engine.engine = ember::make_model_engine(engine.model, o, draft, std::move(adapters), engine.vision);
  }
  new (self) PyEngine(std::move(engine));
}

// Token ids from Python (any int) as the engine's int32 ids; InvalidRequest for one out of range.
std::vector<int32_t> to_tokens(const std::vector<int64_t>& ids, const char* what) {
  std::vector<int32_t> tokens(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < INT32_MIN || ids[i] > INT32_MAX)
      throw ember::InvalidRequest(ember::cat("[request] ", what, " id ", ids[i], " is out of range"));
    tokens[i] = static_cast<int32_t>(ids[i]);
  }
  return tokens;
}

// One image of submit(): (first position, tokens, content hash, preprocessed pixels).
using ImagePixels = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using ImageArg = std::tuple<int64_t, int64_t, uint64_t, ImagePixels>;

PyRequest submit(PyEngine& self, const std::vector<int64_t>& prompt, const ember::SamplingParams& sampling,
                 int64_t max_tokens, const std::vector<int64_t>& stop_token_ids, int32_t logprobs,
                 int priority, std::shared_ptr<ember::Grammar> grammar,
                 const std::vector<int64_t>& prediction, bool post_sampling_probs, bool reuse_prefix,
                 int32_t lora_adapter, float lora_scale, const std::vector<ImageArg>& images) {
  std::vector<int32_t> tokens = to_tokens(prompt, "prompt token");
  ember::RequestOptions o;
  o.max_tokens = max_tokens;
  o.priority = priority;
  o.stop_token_ids = to_tokens(stop_token_ids, "stop token");
  o.sampling = sampling;
  o.n_logprobs = logprobs;
  o.post_sampling_probs = post_sampling_probs;
  o.reuse_prefix = reuse_prefix;
  o.grammar = std::move(grammar);
  o.prediction = to_tokens(prediction, "prediction token");
  o.lora_adapter = lora_adapter;
  o.lora_scale = lora_scale;
  for (const auto& [pos, n_tokens, hash, pixels] : images) {
    ember::RequestImage& image = o.images.emplace_back();
    image.pos = pos;
    image.n_tokens = n_tokens;
    image.hash = hash;
    if (pixels.shape(0) != 3) {
      throw ember::InvalidRequest(ember::cat(
          "[request] image pixels must be float32 [3, height, width], got ", pixels.shape(0), " planes"));
    }
    image.height = static_cast<int64_t>(pixels.shape(1));
    image.width = static_cast<int64_t>(pixels.shape(2));
    image.pixels = std::make_shared<const std::vector<float>>(pixels.data(), pixels.data() + pixels.size());
  }

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

  // The one definition of the engine options and their defaults (engine/engine_options.h); the
  // Python layer (ember.Engine, ember.LLM, the CLI, the server's config) reads them from here.
  nb::class_<ember::EngineOptions> options(m, "EngineOptions",
                                           "How an engine serves its model (engine/engine_options.h); "
                                           "EngineOptions(**fields) starts from the defaults. None: the "
                                           "default that depends on the model or the machine.");
  options.def("__init__", [](ember::EngineOptions* self, const nb::kwargs& fields) {
    new (self) ember::EngineOptions(options_from(std::nullopt, fields));
  });
  std::vector<std::string> names;
  auto field = [&](const char* name, auto member, const char* doc) {
    options.def_rw(name, member, doc);
    names.emplace_back(name);
  };
  field("n_ctx", &ember::EngineOptions::n_ctx,
        "tokens one request may reach (prompt and output); None: the model's, at most default_max_ctx");
  field("parallel", &ember::EngineOptions::parallel, "requests running at once");
  field("kv_size", &ember::EngineOptions::kv_size, "KV cache budget in tokens; None: see kv_bytes");
  field("kv_bytes", &ember::EngineOptions::kv_bytes,
        "KV cache budget in bytes when kv_size is None; both None: n_ctx * parallel tokens, at most "
        "default_kv_bytes");
  field("block_size", &ember::EngineOptions::block_size, "tokens per KV block");
  field("max_batch_tokens", &ember::EngineOptions::max_batch_tokens,
        "tokens per step (prompts are chunked to fit)");
  field("max_queue", &ember::EngineOptions::max_queue,
        "requests waiting for one of the parallel slots at most (0: no limit; past it submit raises "
        "EngineBusy)");
  field("prefix_caching", &ember::EngineOptions::prefix_caching,
        "prompts sharing whole blocks with an earlier one skip their prefill");
  field("cache_dir", &ember::EngineOptions::cache_dir,
        "a directory where full prefix-cache blocks also go, so a restarted engine reads a prompt's "
        "back instead of recomputing it; None: memory only");
  field("cache_disk_bytes", &ember::EngineOptions::cache_disk_bytes,
        "the files in cache_dir at most; the least recently used go first");
  field("kv_type", &ember::EngineOptions::kv_type,
        "'f16' or 'q8_0' (K/V rows quantized to 8 bits in blocks of 32: 34 bytes per 32 values instead "
        "of 64, so a byte budget holds ~1.9x the tokens, at slightly less exact attention; needs "
        "head_dim % 32 == 0)");
  field("batch_invariant", &ember::EngineOptions::batch_invariant,
        "a request's output never depends on what else runs (small batches are padded, attention "
        "runs one row at a time; False is a little faster but lets kernel rounding differ with the "
        "batch)");
  field("spec", &ember::EngineOptions::spec,
        "speculative decoding: 'none', 'ngram' (drafts from each request's own text: prompt lookup) "
        "or 'draft' (from draft_model); requests with a prediction draft from it whatever spec says");
  field("draft_model", &ember::EngineOptions::draft_model,
        "a small .gguf of the same vocabulary that drafts tokens (implies spec 'draft')");
  field("draft_max", &ember::EngineOptions::draft_max, "drafts per request and step at most");
  field("draft_min", &ember::EngineOptions::draft_min, "a request given fewer drafts than this gets none");
  field("spec_adaptive", &ember::EngineOptions::spec_adaptive,
        "draft only as deep as the measured step cost says pays (False: always draft_max)");
  field("mmproj", &ember::EngineOptions::mmproj,
        "a vision projector .gguf (llama.cpp's clip layout, as --mmproj): prompts may hold images");
  field("n_threads", &ember::EngineOptions::n_threads, "CPU threads; None: the physical cores");
  field("device", &ember::EngineOptions::device,
        "'cpu', 'cuda' / 'cuda:N', 'vulkan' / 'vulkan:N', or 'auto' (the first GPU, else the CPU)");
  options.attr("field_names") = nb::tuple(nb::cast(names));
  options.attr("default_max_ctx") = ember::Context::kDefaultMaxCtx;
  options.attr("default_kv_bytes") = ember::kDefaultKVBytes;
  options.def("check", &ember::EngineOptions::check,
              "Raises ValueError naming the first bad value (no model needed).");
  options.def("__repr__", [names](nb::handle self) {
    std::string out = "EngineOptions(";
    for (size_t i = 0; i < names.size(); ++i) {
      out += ember::cat(i ? ", " : "", names[i], "=",
                        nb::cast<std::string>(nb::repr(self.attr(names[i].c_str()))));
    }
    return out + ")";
  });

  nb::class_<PyEngine>(m, "Engine",
                       "A GGUF model served by the continuous-batching engine: a C++ thread runs every "
                       "submitted request in shared batched steps over a paged KV cache with prefix "
                       "caching. Thread-safe.")
      .def("__init__", &init_engine_object, nb::arg("model_path"), nb::arg("options") = nb::none(),
           nb::arg("lora") = std::vector<std::string>{}, nb::arg("fields"),
           "Loads the model and starts the engine thread. `options` (an EngineOptions, else the "
           "defaults) with any EngineOptions field given as a keyword on top; `lora`: paths of LoRA "
           "adapter GGUFs for this model, which requests pick by index (submit's lora_adapter).")
      .def(
          "check_prompt",
          [](const PyEngine& self, const std::vector<int64_t>& prompt) {
            ember::RequestOptions o;
            self.engine->validate(to_tokens(prompt, "prompt token"), o);
          },
          nb::arg("prompt_tokens"),
          "Raises PromptTooLong or InvalidRequest for a prompt that can never run, as submit would.")
      .def("submit", &submit, nb::arg("prompt_tokens"), nb::arg("sampling") = ember::SamplingParams(),
           nb::kw_only(), nb::arg("max_tokens") = ember::RequestOptions().max_tokens,
           nb::arg("stop_token_ids") = std::vector<int64_t>{}, nb::arg("logprobs") = -1,
           nb::arg("priority") = 0, nb::arg("grammar") = nb::none(),
           nb::arg("prediction") = std::vector<int64_t>{}, nb::arg("post_sampling_probs") = false,
           nb::arg("reuse_prefix") = true, nb::arg("lora_adapter") = -1, nb::arg("lora_scale") = 1.0f,
           nb::arg("images") = std::vector<ImageArg>{},
           "Queues a request and returns its EngineRequest. Raises InvalidRequest (a ValueError; "
           "PromptTooLong for a prompt over the context) for a request that can never run (empty or "
           "too long prompt, bad ids), ValueError for bad sampling values, and EngineBusy when the "
           "queue is full. `sampling` is a SamplingParams; logprobs >= 0 adds the chosen token's "
           "log-probability and that many alternatives to each event; `grammar` (a Grammar) constrains "
           "every output token to it; prediction: token ids of the output the caller expects "
           "(OpenAI's Predicted Outputs), drafted from (the output stays the same); post_sampling_probs: "
           "the logprobs are of the distribution after the sampler chain; reuse_prefix=False computes "
           "the whole prompt, no prefix-cache hit; lora_adapter: the index of a loaded LoRA adapter "
           "(-1: none) and lora_scale the factor on its product; images: (first position, tokens, "
           "content hash, float32 [3, height, width] preprocessed pixels) of each image of the prompt, "
           "whose rows take the projector's embeddings (their tokens should be placeholders derived "
           "from the hash: the prefix cache keys them).")
      .def_prop_ro(
          "vision_model",
          [](const PyEngine& self) -> std::optional<PyVisionModel> {
            if (!self.vision) return std::nullopt;
            return PyVisionModel{self.vision, true};
          },
          "The engine's vision projector (a VisionModel whose encode() is refused: images go "
          "through submit), or None.")
      .def(
          "cancel", [](PyEngine& self, ember::RequestId id) { self.engine->cancel(id); }, nb::arg("id"),
          "Ends a request (its stream gets a 'cancelled' event) and frees its KV blocks; unknown or "
          "finished ids are ignored.")
      .def(
          "stats", [](const PyEngine& self) { return stats_dict(self.engine->stats()); },
          "{running, waiting, kv_usage (fraction of blocks referenced), prefix_query_tokens, "
          "prefix_hit_tokens, prompt_tokens_total, generation_tokens_total, preemptions, steps}")
      .def(
          "save_state",
          [](PyEngine& self, const std::vector<int64_t>& tokens, const std::string& path) {
            std::vector<int32_t> ids = to_tokens(tokens, "state token");
            nb::gil_scoped_release release;
            const ember::Engine::StateIO io = self.engine->save_state(std::move(ids), path);
            return std::make_pair(io.n_tokens, io.n_bytes);
          },
          nb::arg("tokens"), nb::arg("path"),
          "Writes `tokens` and the K/V of their leading full blocks still in the prefix cache to a "
          "state file; returns (tokens whose K/V it holds, bytes written). ValueError when it cannot "
          "be written.")
      .def(
          "load_state",
          [](PyEngine& self, const std::string& path) {
            nb::gil_scoped_release release;
            ember::Engine::StateIO io = self.engine->load_state(path);
            return std::make_tuple(std::move(io.tokens), io.n_tokens, io.n_restored, io.n_bytes);
          },
          nb::arg("path"),
          "Reads a state file into the prefix cache; returns (its tokens, tokens whose K/V it holds, "
          "of them now cached, bytes read). ValueError naming what is wrong with a bad file.")
      .def(
          "shutdown",
          [](PyEngine& self) {
            nb::gil_scoped_release release;
            self.engine->shutdown();
          },
          "Stops the engine thread; unfinished requests end 'cancelled', later submits raise EngineBusy.")
      .def_prop_ro("n_vocab", [](const PyEngine& self) { return self.model->config().n_vocab; })
      .def_prop_ro(
          "lora_adapters",
          [](const PyEngine& self) {
            std::vector<std::string> paths;
            for (const auto& a : self.adapters) paths.push_back(a->path());
            return paths;
          },
          "Paths of the loaded LoRA adapters, in index order.")
      .def_prop_ro(
          "n_ctx", [](const PyEngine& self) { return self.engine->max_model_len(); },
          "Tokens one request may reach (prompt and output).")
      .def_prop_ro("parallel", [](const PyEngine& self) { return self.config.scheduler.parallel; })
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
                   [](const PyEngine& self) { return self.config.scheduler.max_batch_tokens; })
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
