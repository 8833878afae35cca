// tokenizer.cpp: bindings for cpp/tokenizer — ember._core.Tokenizer and StreamDecoder.
// Conversions only; encode/decode run with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace nb = nanobind;
using ember::StreamDecoder;
using ember::Tokenizer;

namespace {

// Python ints are unbounded: ids are range-checked as 64-bit values (ValueError, not the
// TypeError a failed int32 conversion would give) before narrowing.
std::vector<int32_t> to_ids(const Tokenizer& t, const std::vector<int64_t>& ids) {
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    t.check_id(ids[i]);
    out[i] = static_cast<int32_t>(ids[i]);
  }
  return out;
}

int32_t to_id(const Tokenizer& t, int64_t id) {
  t.check_id(id);
  return static_cast<int32_t>(id);
}

}  // namespace

void init_tokenizer(nb::module_& m) {
  nb::class_<Tokenizer>(m, "Tokenizer",
                        "Text <-> token ids for the vocabulary in a GGUF file (model or vocabulary-only).")
      .def(nb::new_([](const std::string& path) {
             nb::gil_scoped_release release;
             return std::const_pointer_cast<Tokenizer>(Tokenizer::open(path));
           }),
           nb::arg("path"))
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool add_special, bool parse_special) {
            nb::gil_scoped_release release;
            return t.encode(text, add_special, parse_special);
          },
          nb::arg("text"), nb::arg("add_special") = true, nb::arg("parse_special") = false,
          "Token ids of `text`; add_special adds BOS/EOS as the vocabulary asks, parse_special turns "
          "control-token texts such as '<|im_start|>' into those tokens.")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int64_t>& ids, bool skip_special) {
            const std::vector<int32_t> checked = to_ids(t, ids);
            nb::gil_scoped_release release;
            return t.decode(checked, skip_special);
          },
          nb::arg("ids"), nb::arg("skip_special") = true,
          "Text of `ids` (broken UTF-8 becomes U+FFFD); skip_special hides control tokens.")
      .def(
          "token_to_piece",
          [](const Tokenizer& t, int64_t id, bool render_special) {
            const std::string_view piece = t.piece(to_id(t, id), render_special);
            return nb::bytes(piece.data(), piece.size());
          },
          nb::arg("id"), nb::arg("render_special") = true, "The bytes token `id` stands for.")
      .def("is_eog", &Tokenizer::is_eog, nb::arg("id"),
           "Whether `id` ends generation (EOS, end of turn, ...).")
      .def_prop_ro("n_vocab", &Tokenizer::n_vocab)
      .def_prop_ro("bos", &Tokenizer::bos, "BOS id, -1 when the vocabulary has none.")
      .def_prop_ro("eos", &Tokenizer::eos, "EOS id, -1 when the vocabulary has none.")
      .def_prop_ro("eot", &Tokenizer::eot, "End-of-turn id, -1 when the vocabulary has none.")
      .def_prop_ro("add_bos", [](const Tokenizer& t) { return t.vocab().add_bos(); })
      .def_prop_ro("add_eos", [](const Tokenizer& t) { return t.vocab().add_eos(); })
      .def_prop_ro(
          "model", [](const Tokenizer& t) { return t.vocab().model_name(); },
          "tokenizer.ggml.model: 'llama', 'gpt2', 'gemma4', 'whitespace' or 'bert'.")
      .def_prop_ro(
          "pre", [](const Tokenizer& t) { return t.vocab().pre_name(); },
          "tokenizer.ggml.pre, 'default' when absent.")
      .def("__len__", &Tokenizer::n_vocab);

  nb::class_<StreamDecoder>(m, "StreamDecoder",
                            "Incremental detokenizer: push ids one at a time, get only whole UTF-8 text.")
      .def(nb::init<std::shared_ptr<const Tokenizer>, bool>(), nb::arg("tokenizer"),
           nb::arg("skip_special") = true)
      .def(
          "push", [](StreamDecoder& d, int64_t id) { return d.push(to_id(d.tokenizer(), id)); },
          nb::arg("id"), "Adds one token; returns the text that became complete (maybe '').")
      .def("flush", &StreamDecoder::flush,
           "Returns held-back bytes (U+FFFD for incomplete ones) and resets.");

  m.def(
      "pre_tokenize",
      [](const std::string& name, const std::string& text) {
        nb::gil_scoped_release release;
        return ember::pre_tokenize(name, text);
      },
      nb::arg("name"), nb::arg("text"),
      "The words byte-level BPE encodes one by one when tokenizer.ggml.pre is `name`.");
  m.def(
      "pre_tokenizer_names",
      [] {
        const std::vector<std::string_view> names = ember::pre_tokenizer_names();
        return std::vector<std::string>(names.begin(), names.end());
      },
      "Every tokenizer.ggml.pre value ember knows.");
}
