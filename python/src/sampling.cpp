// sampling.cpp: bindings for cpp/sampling — ember._core.SamplingParams, Sampler, token_logprobs
// and StopStringMatcher. Logits come in as float32 numpy rows without a copy.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"
#include "sampling/stop_strings.h"

namespace nb = nanobind;
using ember::Sampler;
using ember::SamplingParams;
using ember::StopStringMatcher;

namespace {

using LogitsRow = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

const float* row_or_throw(const LogitsRow& logits, int64_t n_vocab) {
  if (static_cast<int64_t>(logits.shape(0)) != n_vocab) {
    throw ember::InvalidArgument(
        ember::cat("[sampling] logits: expected ", n_vocab, " values (n_vocab), got ", logits.shape(0)));
  }
  return logits.data();
}

// SamplingParams(**fields): the C++ defaults, then each keyword set as an attribute (so a
// misspelt field is an AttributeError, and types are checked by the attribute's setter).
void init_params(SamplingParams* self, const nb::kwargs& fields) {
  nb::object defaults = nb::cast(SamplingParams());
  for (auto [name, value] : fields) nb::setattr(defaults, name, value);
  new (self) SamplingParams(nb::cast<const SamplingParams&>(defaults));
}

}  // namespace

void init_sampling(nb::module_& m) {
  // The one definition of the sampling fields and their defaults (sampling/params.h); the
  // Python layer reads its defaults from an instance of this class.
  nb::class_<SamplingParams> params(m, "SamplingParams",
                                    "What one request asks of its sampler (sampling/params.h); "
                                    "SamplingParams(**fields) starts from the defaults.");
  params.def("__init__", &init_params);
  std::vector<std::string> names;
  auto field = [&](const char* name, auto member, const char* doc) {
    params.def_rw(name, member, doc);
    names.emplace_back(name);
  };
  field("temperature", &SamplingParams::temperature, "<= 0: greedy");
  field("top_k", &SamplingParams::top_k, "<= 0: off");
  field("top_p", &SamplingParams::top_p, "1: off");
  field("min_p", &SamplingParams::min_p, "0: off; keeps tokens with p >= min_p * p_max");
  field("typical_p", &SamplingParams::typical_p, "1: off (locally typical sampling)");
  field("repeat_penalty", &SamplingParams::repeat_penalty, "1: off");
  field("repeat_last_n", &SamplingParams::repeat_last_n,
        "penalty window in tokens; 0: no penalties, -1: every token seen");
  field("presence_penalty", &SamplingParams::presence_penalty, "subtracted once per token in the window");
  field("frequency_penalty", &SamplingParams::frequency_penalty, "subtracted per occurrence in the window");
  field("logit_bias", &SamplingParams::logit_bias, "[(token id, added to its logit)]");
  field("seed", &SamplingParams::seed, "the random generator's seed");
  field("min_tokens", &SamplingParams::min_tokens,
        "outputs before a stop token may be sampled (the Sampler's stop_ids)");
  params.attr("field_names") = nb::tuple(nb::cast(names));
  params.def(
      "validate", [](const SamplingParams& p, int32_t n_vocab) { ember::validate(p, n_vocab); },
      nb::arg("n_vocab"), "Raises ValueError naming the first field out of range.");

  nb::class_<Sampler>(m, "Sampler",
                      "One request's sampler: logit bias, penalties over a window of recent "
                      "tokens, top-k, typical-p, top-p, min-p, temperature and a seeded draw.")
      .def(
          "__init__",
          [](Sampler* self, const SamplingParams& params, int32_t n_vocab,
             std::shared_ptr<ember::Grammar> grammar, std::vector<int32_t> stop_ids) {
            if (n_vocab > 0) ember::validate(params, n_vocab);  // this binding is a request's edge
            new (self) Sampler(params, n_vocab, grammar ? grammar->start() : nullptr, std::move(stop_ids));
          },
          nb::arg("params"), nb::arg("n_vocab"), nb::arg("grammar") = nb::none(),
          nb::arg("stop_ids") = std::vector<int32_t>{},
          "Raises ValueError for parameters out of range. With a Grammar, every sample is a token it "
          "allows (advance() moves it on).")
      .def("advance", &Sampler::advance, nb::arg("token"),
           "The sampled token became the output: moves the grammar past it (False if it rejects it).")
      .def(
          "sample",
          [](Sampler& s, const LogitsRow& logits) {
            const float* row = row_or_throw(logits, s.n_vocab());
            nb::gil_scoped_release release;
            return s.sample(row);
          },
          nb::arg("logits"), "The next token for float32 logits [n_vocab]; does not accept it.")
      .def(
          "distribution",
          [](Sampler& s, const LogitsRow& logits) {
            const ember::Candidates& c = s.distribution(row_or_throw(logits, s.n_vocab()));
            const size_t n = c.items.size();
            auto* ids = new int32_t[n];
            auto* probs = new float[n];
            for (size_t i = 0; i < n; ++i) {
              ids[i] = c.items[i].id;
              probs[i] = c.items[i].p;
            }
            nb::capsule ids_owner(ids, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
            nb::capsule probs_owner(probs, [](void* p) noexcept { delete[] static_cast<float*>(p); });
            return nb::make_tuple(nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>(ids, {n}, ids_owner),
                                  nb::ndarray<nb::numpy, float, nb::ndim<1>>(probs, {n}, probs_owner));
          },
          nb::arg("logits"),
          "(ids int32 [k], probs float32 [k]): the candidates sample() would draw from, with "
          "their final probabilities")
      .def("accept", &Sampler::accept, nb::arg("token"), "Adds a token to the penalty window.")
      .def(
          "accept_many",
          [](Sampler& s, const std::vector<int32_t>& tokens) {
            for (int32_t t : tokens) s.accept(t);
          },
          nb::arg("tokens"))
      .def("reset", &Sampler::reset, "Empties the penalty window and reseeds.")
      .def_prop_ro("n_vocab", &Sampler::n_vocab);

  m.def(
      "token_logprobs",
      [](const LogitsRow& logits, int32_t token, int32_t n_top) {
        const int32_t n_vocab = static_cast<int32_t>(logits.shape(0));
        ember::TokenLogprobs lp;
        {
          nb::gil_scoped_release release;
          lp = ember::token_logprobs(logits.data(), n_vocab, token, n_top);
        }
        return std::make_pair(lp.logprob, lp.top);
      },
      nb::arg("logits"), nb::arg("token"), nb::arg("n_top") = 0,
      "(logprob of token, [(id, logprob)] of the n_top most likely): log-softmax of raw logits");

  nb::class_<StopStringMatcher>(m, "StopStringMatcher",
                                "Finds stop strings in streamed text, holding back text that "
                                "could be the start of one.")
      .def(nb::init<std::vector<std::string>>(), nb::arg("stops"))
      .def(
          "push",
          [](StopStringMatcher& s, const std::string& piece) {
            StopStringMatcher::Result r = s.push(piece);
            return nb::make_tuple(r.text, r.stopped, r.stop);
          },
          nb::arg("text"), "(text safe to emit, stopped, the stop string found or '')")
      .def("flush", &StopStringMatcher::flush, "The held-back text, once generation has ended.")
      .def_prop_ro("stopped", &StopStringMatcher::stopped);
}
