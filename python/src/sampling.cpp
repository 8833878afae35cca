// sampling.cpp: bindings for cpp/sampling — ember._core.Sampler, token_logprobs and
// StopStringMatcher. Logits come in as float32 numpy rows without a copy.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <map>
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
    throw ember::InvalidArgument(ember::cat("[sampling] logits: expected ", n_vocab,
                                            " values (n_vocab), got ", logits.shape(0)));
  }
  return logits.data();
}

Sampler* make_sampler(int32_t n_vocab, float temperature, int32_t top_k, float top_p, float min_p,
                      float typical_p, float repeat_penalty, int32_t repeat_last_n,
                      float presence_penalty, float frequency_penalty,
                      const std::map<int32_t, float>& logit_bias, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.typical_p = typical_p;
  p.repeat_penalty = repeat_penalty;
  p.repeat_last_n = repeat_last_n;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  p.logit_bias.assign(logit_bias.begin(), logit_bias.end());
  p.seed = seed;
  return new Sampler(p, n_vocab);
}

}  // namespace

void init_sampling(nb::module_& m) {
  const SamplingParams d;  // defaults shown to Python are the C++ ones
  nb::class_<Sampler>(m, "Sampler",
                      "One request's sampler: logit bias, penalties over a window of recent "
                      "tokens, top-k, typical-p, top-p, min-p, temperature and a seeded draw.")
      .def(nb::new_(&make_sampler), nb::arg("n_vocab"), nb::kw_only(),
           nb::arg("temperature") = d.temperature, nb::arg("top_k") = d.top_k,
           nb::arg("top_p") = d.top_p, nb::arg("min_p") = d.min_p,
           nb::arg("typical_p") = d.typical_p, nb::arg("repeat_penalty") = d.repeat_penalty,
           nb::arg("repeat_last_n") = d.repeat_last_n,
           nb::arg("presence_penalty") = d.presence_penalty,
           nb::arg("frequency_penalty") = d.frequency_penalty,
           nb::arg("logit_bias") = std::map<int32_t, float>{}, nb::arg("seed") = d.seed)
      .def("sample", [](Sampler& s, const LogitsRow& logits) {
        const float* row = row_or_throw(logits, s.n_vocab());
        nb::gil_scoped_release release;
        return s.sample(row);
      }, nb::arg("logits"), "The next token for float32 logits [n_vocab]; does not accept it.")
      .def("distribution", [](Sampler& s, const LogitsRow& logits) {
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
      }, nb::arg("logits"),
           "(ids int32 [k], probs float32 [k]): the candidates sample() would draw from, with "
           "their final probabilities")
      .def("accept", &Sampler::accept, nb::arg("token"), "Adds a token to the penalty window.")
      .def("accept_many", [](Sampler& s, const std::vector<int32_t>& tokens) {
        for (int32_t t : tokens) s.accept(t);
      }, nb::arg("tokens"))
      .def("reset", &Sampler::reset, "Empties the penalty window and reseeds.")
      .def_prop_ro("n_vocab", &Sampler::n_vocab);

  m.def("token_logprobs", [](const LogitsRow& logits, int32_t token, int32_t n_top) {
    const int32_t n_vocab = static_cast<int32_t>(logits.shape(0));
    ember::TokenLogprobs lp;
    {
      nb::gil_scoped_release release;
      lp = ember::token_logprobs(logits.data(), n_vocab, token, n_top);
    }
    return std::make_pair(lp.logprob, lp.top);
  }, nb::arg("logits"), nb::arg("token"), nb::arg("n_top") = 0,
        "(logprob of token, [(id, logprob)] of the n_top most likely): log-softmax of raw logits");

  nb::class_<StopStringMatcher>(m, "StopStringMatcher",
                                "Finds stop strings in streamed text, holding back text that "
                                "could be the start of one.")
      .def(nb::init<std::vector<std::string>>(), nb::arg("stops"))
      .def("push", [](StopStringMatcher& s, const std::string& piece) {
        StopStringMatcher::Result r = s.push(piece);
        return nb::make_tuple(r.text, r.stopped, r.stop);
      }, nb::arg("text"), "(text safe to emit, stopped, the stop string found or '')")
      .def("flush", &StopStringMatcher::flush, "The held-back text, once generation has ended.")
      .def_prop_ro("stopped", &StopStringMatcher::stopped);
}
