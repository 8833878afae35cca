// tokenizer/pre_tokenizer.cpp: the table from tokenizer.ggml.pre names to regex lists (the same
// grouping as llama.cpp's llama-vocab.cpp) and the splitting loop that applies them.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <initializer_list>

#include "core/error.h"

namespace ember {

namespace {

namespace p = patterns;

struct NamedSpec {
  std::initializer_list<std::string_view> names;
  std::initializer_list<Pass> passes;
  bool ignore_merges = false;
  bool adds_bos = false;
  bool adds_sep = false;
  bool forces_bos = false;
  bool raw_utf8 = false;
  bool escape_spaces = false;
  bool whole_newline_runs = false;
  bool drops_whitespace = false;
};

// Every tokenizer.ggml.pre value llama.cpp's llama-vocab.cpp knows for BPE, with its
// regexes and defaults. Names sharing a row use the same regexes; the comments give llama.cpp's
// group names (a group whose regexes equal another's shares that row).
const NamedSpec k_specs[] = {
    // LLAMA3: Llama 3 and its descendants keep whole-word tokens and open with BOS.
    {.names = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
               "jina-v5-nano"},
     .passes = {p::llama3},
     .ignore_merges = true,
     .adds_bos = true},
    // DBRX, SMAUG, CHATGLM4 (chatglm-bpe): the Llama 3 regex alone.
    {.names = {"dbrx", "smaug-bpe", "chatglm-bpe"}, .passes = {p::llama3}},
    // CHATGLM4 (glm4, glm5): the Llama 3 regex, whole-word tokens kept.
    {.names = {"glm4", "glm5"}, .passes = {p::llama3}, .ignore_merges = true},
    // JAIS2: the Llama 3 regex with whitespace runs cut at powers of two.
    {.names = {"jais-2"}, .passes = {p::jais2}},
    // MINICPM5: numbers in threes, then the Llama 3 regex with \p{N}+.
    {.names = {"minicpm5"}, .passes = {p::numbers_up_to_3, p::minicpm5}, .ignore_merges = true},
    // QWEN2, STABLELM2, HUNYUAN, SOLAR_OPEN, GROK_2, BAILINGMOE: the Llama 3 regex with single
    // digits (BailingMoE's possessive quantifiers and \s*[\r\n] end every match at the same place).
    {.names = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "megrez",
               "solar-open", "grok-2", "bailingmoe", "bailingmoe2", "llada-moe"},
     .passes = {p::qwen2}},
    // QWEN35
    {.names = {"qwen35"}, .passes = {p::qwen35}},
    // UFAKZEKA
    {.names = {"ufakzeka"}, .passes = {p::ufakzeka}},
    // SEED_CODER
    {.names = {"seed-coder"}, .passes = {p::seed_coder}},
    // LAGUNA: lines first, then the Qwen2 regex.
    {.names = {"laguna"}, .passes = {p::newline_runs, p::qwen2}},
    // EXAONE_MOE
    {.names = {"exaone-moe"}, .passes = {p::exaone_moe}},
    // GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING: the GPT-2 regex ("gpt2" is ember's own:
    // its converter wrote that before it spelled llama.cpp's "gpt-2").
    {.names = {"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
               "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "exaone4",
               "granite-docling"},
     .passes = {p::gpt2}},
    // GPT2 for the BERT-like encoders: [SEP] closes the text.
    {.names = {"jina-v1-en", "jina-v2-code", "roberta-bpe"}, .passes = {p::gpt2}, .adds_sep = true},
    // STARCODER and friends: digits one by one, then the GPT-2 regex.
    {.names = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"},
     .passes = {p::one_number, p::gpt2}},
    // DEEPSEEK_LLM
    {.names = {"deepseek-llm"},
     .passes = {p::newline, p::deepseek_llm_letters, p::deepseek_llm_punctuation, p::trailing_whitespace,
                p::cjk_run, p::numbers}},
    // DEEPSEEK_CODER
    {.names = {"deepseek-coder"},
     .passes = {p::newline, p::space_letters, p::space_punctuation, p::cjk_run, p::one_number}},
    // DEEPSEEK3_LLM, HUNYUAN_DENSE, JOYAI_LLM, HY_V4
    {.names = {"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
     .passes = {p::numbers_up_to_3, p::cjk_kana_run, p::deepseek3}},
    // SPARK2_5
    {.names = {"spark2_5"}, .passes = {p::numbers_up_to_3, p::cjk_kana_run, p::spark2_5, p::one_number}},
    // AFMOE
    {.names = {"afmoe"}, .passes = {p::digit_groups, p::afmoe_scripts, p::deepseek3}},
    // YOUTU
    {.names = {"youtu"}, .passes = {p::youtu_scripts, p::youtu}, .ignore_merges = true},
    // GPT4O, MINIMAX_M2: o200k.
    {.names = {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, .passes = {p::gpt4o}},
    // GRANITE_EMB_MULTI: o200k (llama.cpp adds back the \p{M} its GPT4O copy lacks).
    {.names = {"granite-embed-multi-97m"}, .passes = {p::gpt4o}, .ignore_merges = true},
    // TINY_AYA: numbers in threes from the right, then o200k.
    {.names = {"tiny_aya", "cohere2moe"}, .passes = {p::decimal_groups_to_boundary, p::gpt4o}},
    // TEKKEN
    {.names = {"tekken"}, .passes = {p::tekken}, .ignore_merges = true, .adds_bos = true},
    // KIMI_K2
    {.names = {"kimi-k2"}, .passes = {p::kimi_k2}},
    // SUPERBPE: numbers, then cut before every three digits that end a run.
    {.names = {"superbpe"}, .passes = {p::numbers, p::split_before_decimal_triples}},
    // CHAMELEON: its image and sentinel tokens, whitespace, digits and punctuation, then GPT-2.
    {.names = {"chameleon"},
     .passes = {p::chameleon_sentinel, p::chameleon_image, p::chameleon_whitespace, p::one_number,
                p::one_punctuation_or_ascii_symbol, p::gpt2},
     .adds_bos = true},
    // FALCON
    {.names = {"falcon"}, .passes = {p::punctuation_run_falcon, p::gpt2, p::three_ascii_digits}},
    // BLOOM, PORO, GPT3-FINNISH
    {.names = {"bloom", "poro-chat", "gpt3-finnish"}, .passes = {p::bloom}},
    // VIKING: BLOOM's, then digits one by one.
    {.names = {"viking"}, .passes = {p::bloom, p::one_number}},
    // GEMMA4: SentencePiece-style BPE over lines ("▁" for spaces, <0xXX> byte fallback), with BOS
    // even where the file turns it off. tokenizer.ggml.model "gemma4" implies this name.
    {.names = {"gemma4", "granite-embed-multi-311m"},
     .passes = {p::newline_runs},
     .adds_bos = true,
     .forces_bos = true,
     .raw_utf8 = true,
     .escape_spaces = true,
     .whole_newline_runs = true},
    // SARVAM_MOE: the same BPE over lines, without Gemma 4's newline and BOS rules.
    {.names = {"sarvam-moe"}, .passes = {p::newline_runs}, .raw_utf8 = true, .escape_spaces = true},
    // WHITESPACE: \S+ words over raw UTF-8; the whitespace between them is dropped (llama.cpp drops
    // it for tokenizer.ggml.model "whitespace", the model its converter always pairs with this name,
    // and aborts on it under "gpt2").
    {.names = {"whitespace"}, .passes = {p::non_whitespace_run}, .raw_utf8 = true, .drops_whitespace = true},
    // DEFAULT: what llama.cpp uses when a BPE file names no pre-tokenizer.
    {.names = {"default"}, .passes = {p::punctuation_run, p::gpt2, p::numbers, p::three_ascii_digits}},
};

}  // namespace

std::optional<PreTokenizerSpec> find_pre_tokenizer(std::string_view name) {
  for (const NamedSpec& s : k_specs) {
    if (std::find(s.names.begin(), s.names.end(), name) != s.names.end()) {
      return PreTokenizerSpec{std::vector<Pass>(s.passes),
                              s.ignore_merges,
                              s.adds_bos,
                              s.adds_sep,
                              s.forces_bos,
                              s.raw_utf8,
                              s.escape_spaces,
                              s.whole_newline_runs,
                              s.drops_whitespace};
    }
  }
  return std::nullopt;
}

std::vector<std::string_view> pre_tokenizer_names() {
  std::vector<std::string_view> out;
  for (const NamedSpec& s : k_specs) out.insert(out.end(), s.names.begin(), s.names.end());
  return out;
}

std::string known_pre_tokenizers() {
  std::string out;
  for (std::string_view name : pre_tokenizer_names()) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::vector<std::string> pre_tokenize(std::string_view name, std::string_view text) {
  std::optional<PreTokenizerSpec> spec = find_pre_tokenizer(name);
  if (!spec) {
    throw Unsupported(
        cat("[tokenizer] pre-tokenizer '", name, "' is not supported; known: ", known_pre_tokenizers()));
  }
  PreTokenizer::Scratch scratch;
  std::vector<std::pair<size_t, size_t>> ranges;
  PreTokenizer(std::move(spec->passes)).split(text, ranges, scratch);
  std::vector<std::string> words;
  words.reserve(ranges.size());
  for (const auto& [begin, end] : ranges) words.emplace_back(text.substr(begin, end - begin));
  return words;
}

void PreTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& words,
                         Scratch& scratch) const {
  CodepointText& t = scratch.text;
  t.assign(text);
  auto& segments = scratch.segments;
  auto& next = scratch.next;
  segments.assign(1, {0, t.size()});
  for (const Pass& pass : passes_) {
    next.clear();
    for (const auto& [begin, end] : segments) {
      if (pass.split) {
        pass.split(t, begin, end, next);
        continue;
      }
      const MatchFn match = pass.match;
      // A regex search over [begin, end): matches become pieces, and so do the gaps between
      // them (the gaps are split further by the next regex, or become words as they are).
      size_t gap = begin;
      for (size_t pos = begin; pos < end;) {
        const size_t n = match(t, pos, end);
        if (n == 0) {
          ++pos;
          continue;
        }
        if (gap < pos) next.emplace_back(gap, pos);
        next.emplace_back(pos, pos + n);
        pos += n;
        gap = pos;
      }
      if (gap < end) next.emplace_back(gap, end);
    }
    std::swap(segments, next);
  }
  for (const auto& [begin, end] : segments) words.emplace_back(t.offsets[begin], t.offsets[end]);
}

}  // namespace ember
