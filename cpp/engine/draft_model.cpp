// engine/draft_model.cpp: greedy guesses from a draft model over its own paged KV cache.
#include "engine/draft_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "engine/draft_lookup.h"
#include "model/forward.h"
#include "quant/types.h"

namespace ember {

void check_same_vocabulary(const Model& target, const Model& draft) {
  const int64_t n_target = target.config().n_vocab, n_draft = draft.config().n_vocab;
  if (n_target != n_draft) {
    throw InvalidArgument(cat("[speculation] the draft model '", draft.file().path(), "' has ", n_draft,
                              " tokens, the model ", n_target, ": a draft model needs the same vocabulary"));
  }
  const auto a = target.file().get_strings("tokenizer.ggml.tokens");
  const auto b = draft.file().get_strings("tokenizer.ggml.tokens");
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) {
      throw InvalidArgument(cat("[speculation] the draft model '", draft.file().path(), "' spells token ", i,
                                " differently from the model: a draft model needs the same vocabulary"));
    }
  }
}

int64_t draft_vocab_rows(int64_t n_vocab) {
  if (n_vocab < 32768) return n_vocab;
  const int64_t rows = (std::max<int64_t>(16384, n_vocab / 4) + kVocabRowsAlign - 1) / kVocabRowsAlign;
  return std::min(n_vocab, rows * kVocabRowsAlign);
}

ModelDrafter::ModelDrafter(std::shared_ptr<const Model> draft, const DraftModelConfig& config)
    : model_(std::move(draft)), config_(config), kv_([&] {
        KVCacheConfig c;
        c.n_blocks = config.n_blocks;
        c.block_size = config.block_size;
        c.prefix_caching = false;
        return c;
      }()) {
  if (!model_) throw InvalidArgument("[speculation] no draft model");
  if (config.max_batch_rows < 1) {
    throw InvalidArgument(cat("[speculation] max_batch_rows must be >= 1, got ", config.max_batch_rows));
  }
  const ModelConfig& c = model_->config();
  cache_ = PagedKVCache(model_->backend(), c.n_layer, c.n_head_kv, c.head_dim, config.n_blocks,
                        config.block_size);
  scratch_ = Scratch(model_->backend(), c, config.max_batch_rows);
  scratch_.long_rope = model_->uses_long_rope(config.n_ctx);
  vocab_rows_ = config.vocab_rows < 0    ? draft_vocab_rows(c.n_vocab)
                : config.vocab_rows == 0 ? c.n_vocab
                                         : config.vocab_rows;
  if (!valid_vocab_rows(vocab_rows_, c.n_vocab)) {
    throw InvalidArgument(cat("[speculation] a draft model's vocab_rows must be at most its ", c.n_vocab,
                              " tokens and a multiple of ", kVocabRowsAlign, ", got ", config.vocab_rows));
  }
  // The rare tokens' rows come from the file's head: where its type has no row reader, every
  // guess scores the whole vocabulary.
  const GGUFTensorInfo* head = model_->file().find_tensor(model_->weights().tied_output ? "token_embd.weight"
                                                                                        : "output.weight");
  if (head && type_traits(head->type).dequantize_row) {
    head_ = head->data;
    head_type_ = head->type;
  } else {
    vocab_rows_ = c.n_vocab;
  }
}

void ModelDrafter::scan_rare(SequenceDraft& s, std::span<const int32_t> tokens) const {
  const int64_t n_embd = model_->config().n_embd, n_row_bytes = row_bytes(head_type_, n_embd);
  for (; s.n_scanned < static_cast<int64_t>(tokens.size()); ++s.n_scanned) {
    const int32_t t = tokens[static_cast<size_t>(s.n_scanned)];
    if (t < vocab_rows_ || std::ranges::find(s.rare, t) != s.rare.end()) continue;
    if (s.rare.size() == kMaxRare) break;
    s.rare.push_back(t);
    s.rare_rows.resize(s.rare.size() * static_cast<size_t>(n_embd));
    type_traits(head_type_)
        .dequantize_row(head_ + t * n_row_bytes, s.rare_rows.data() + s.rare_rows.size() - n_embd, n_embd);
  }
}

void ModelDrafter::release(std::span<const RequestId> ids) {
  for (RequestId id : ids) {
    kv_.free(id);
    seqs_.erase(id);
  }
}

void ModelDrafter::run(std::span<const Rows> rows, std::span<Query> queries, std::vector<Guess>& guesses) {
  tokens_.clear();
  positions_.clear();
  output_rows_.clear();
  seq_rows_.clear();
  for (const Rows& r : rows) {
    const int64_t row_begin = static_cast<int64_t>(tokens_.size());
    for (int64_t i = 0; i < r.count; ++i) {
      tokens_.push_back(r.tokens[i]);
      positions_.push_back(static_cast<int32_t>(r.start + i));
    }
    seq_rows_.push_back({row_begin, r.count, cache_.layer(0, kv_.block_table(queries[r.query].id).data())});
    for (int64_t i = r.count - r.n_logits; i < r.count; ++i)
      output_rows_.push_back(static_cast<int32_t>(row_begin + i));
  }
  const ModelConfig& c = model_->config();
  const bool part = vocab_rows_ < c.n_vocab;
  const auto begin = std::chrono::steady_clock::now();
  forward_rows(*model_, scratch_, tokens_, positions_, seq_rows_, cache_.layer_bytes(), output_rows_, logits_,
               vocab_rows_, part ? &hidden_ : nullptr);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - begin;
  ++n_passes_;
  // A new prompt's catch-up is a prefill (a GEMM over hundreds of rows): priced with it, a
  // guess's pass would look cheap per row and dear in fixed cost, so only drafting passes count.
  const bool drafting = std::ranges::none_of(queries, [](const Query& q) { return q.n_draft == 0; });
  if (drafting) cost_.add(static_cast<int64_t>(tokens_.size()), took.count());
  int64_t k = 0;
  for (const Rows& r : rows) {
    const SequenceDraft* s = part && r.n_logits > 0 ? &seqs_.at(queries[r.query].id) : nullptr;
    for (int64_t i = 0; i < r.n_logits; ++i, ++k) {
      guesses.push_back(
          guess(logits_.data() + k * vocab_rows_, part ? hidden_.data() + k * c.n_embd : nullptr, s));
    }
  }
}

ModelDrafter::Guess ModelDrafter::guess(const float* logits, const float* hidden, const SequenceDraft* s) {
  const ModelConfig& c = model_->config();
  const float* top = std::max_element(logits, logits + vocab_rows_);
  int32_t best = static_cast<int32_t>(top - logits);
  float max = *top;
  // The request's rare tokens, scored as the head would (its rows in f32 against the row's final
  // state; soft-capped where the model caps its logits).
  rare_logits_.clear();
  for (size_t j = 0; s && j < s->rare.size(); ++j) {
    const float* w = s->rare_rows.data() + j * static_cast<size_t>(c.n_embd);
    float part_sums[8] = {};  // eight independent sums, for the vector units
    int64_t e = 0;
    for (; e + 8 <= c.n_embd; e += 8) {
      for (int x = 0; x < 8; ++x) part_sums[x] += hidden[e + x] * w[e + x];
    }
    for (; e < c.n_embd; ++e) part_sums[0] += hidden[e] * w[e];
    float z = 0.0f;
    for (float v : part_sums) z += v;
    if (c.final_softcap > 0.0f) z = c.final_softcap * std::tanh(z / c.final_softcap);
    rare_logits_.push_back(z);
    if (z > max) {
      max = z;
      best = s->rare[j];
    }
  }
  // The top token's softmax probability (over the tokens scored); logits 16 below the top add
  // < 1.2e-7 each, so the sum skips them (what they could add in all moves p by well under 1%).
  float sum = 0.0f;
  for (int64_t t = 0; t < vocab_rows_; ++t) {
    if (logits[t] > max - 16.0f) sum += std::exp(logits[t] - max);
  }
  for (float z : rare_logits_) {
    if (z > max - 16.0f) sum += std::exp(z - max);
  }
  return {best, 1.0f / sum};
}

void ModelDrafter::propose(std::span<Query> queries) {
  const size_t n_q = queries.size();
  // Per query: its tokens, then its guesses so far (work); how many leading positions of work
  // have valid draft K/V (n_valid); guesses of the last pass not yet judged (pending); what the
  // next pass feeds it (feed: work[n_valid ..], then tokens prompt lookup expects after them).
  std::vector<std::vector<int32_t>> work(n_q), feed(n_q);
  std::vector<std::vector<Guess>> pending(n_q);
  std::vector<int64_t> n_known(n_q), n_valid(n_q), n_lookahead(n_q, 0);
  std::vector<bool> active(n_q, false);
  for (size_t q = 0; q < n_q; ++q) {
    Query& query = queries[q];
    query.drafts.clear();
    query.probabilities.clear();
    // Catching up only (a new prompt): every token but the last, whose row gives the first guess
    // at the next call.
    const int64_t n = static_cast<int64_t>(query.tokens.size()) - (query.n_draft == 0 ? 1 : 0);
    if (query.n_draft < 0 || n < 1) continue;
    SequenceDraft& s = seqs_[query.id];
    if (vocab_rows_ < model_->config().n_vocab) scan_rare(s, query.tokens);
    // Guesses of the last call that came true kept valid K/V; at least the last token runs again
    // (its row gives the first guess).
    int64_t c = std::min(s.n_computed, n);
    for (int32_t g : s.speculative) {
      if (c >= n || query.tokens[c] != g) break;
      ++c;
    }
    c = std::min(c, query.n_draft == 0 ? n : n - 1);
    // Slots up to the last guess fed back: positions [0, n + n_draft - 1).
    const int64_t n_slots = query.n_draft == 0 ? n - c : n + query.n_draft - 1 - c;
    if (n_slots > 0 && !kv_.allocate_slots({query.id, query.tokens, c}, n_slots)) continue;
    work[q].assign(query.tokens.begin(), query.tokens.begin() + n);
    work[q].reserve(static_cast<size_t>(n + query.n_draft));
    n_known[q] = n;
    n_valid[q] = c;
    active[q] = true;
  }
  std::vector<Guess> guesses;
  std::vector<Rows> rows;
  for (;;) {
    // Judge what the last pass guessed; then each query that wants more feeds the rest of its
    // text and its lookahead.
    rows.clear();
    for (size_t q = 0; q < n_q; ++q) {
      if (!active[q]) continue;
      Query& query = queries[q];
      bool more = true;
      for (const Guess& g : pending[q]) {
        const Query::Verdict verdict = query.judge ? query.judge(g.probability) : Query::Verdict{true, true};
        more = verdict.keep && verdict.more && std::ssize(query.drafts) + 1 < query.n_draft;
        if (!verdict.keep) break;
        work[q].push_back(g.token);
        query.drafts.push_back(g.token);
        query.probabilities.push_back(g.probability);
        if (!more) break;
      }
      pending[q].clear();
      if (!more) {
        active[q] = false;
        continue;
      }
      feed[q].assign(work[q].begin() + n_valid[q], work[q].end());
      n_lookahead[q] = 0;
      if (query.n_draft > 0 && config_.lookahead > 0) {
        // Each looked-ahead token the draft agrees with is one more guess: at most the guesses
        // still wanted after the pass's first.
        const int64_t n_ahead = std::min(
            {config_.lookahead, query.n_draft - std::ssize(query.drafts) - 1, config_.max_batch_rows - 1});
        const std::vector<int32_t> ahead = ngram_drafts(work[q], 2, 4, n_ahead);
        feed[q].insert(feed[q].end(), ahead.begin(), ahead.end());
        n_lookahead[q] = std::ssize(ahead);
      }
      if (query.n_draft == 0) active[q] = false;  // catching up only: no guesses
    }
    // The feeds in passes of at most max_batch_rows rows (a long prompt's catch-up spreads over
    // several); a feed's guessing rows (its last 1 + lookahead) stay in one pass.
    int64_t n_rows = 0;
    const auto flush = [&] {
      if (rows.empty()) return;
      guesses.clear();
      run(rows, queries, guesses);
      size_t k = 0;
      for (const Rows& r : rows) {
        if (r.n_logits == 0) continue;
        // Guess i came from the row after looked-ahead token i - 1: it stands while every
        // looked-ahead token before it was the guess before it.
        const size_t q = r.query;
        const int64_t n_ahead = r.n_logits - 1;
        int64_t n_agree = 0;
        pending[q].push_back(guesses[k]);
        const int32_t* ahead = r.tokens + r.count - n_ahead;
        while (n_agree < n_ahead && ahead[n_agree] == guesses[k + static_cast<size_t>(n_agree)].token) {
          ++n_agree;
          pending[q].push_back(guesses[k + static_cast<size_t>(n_agree)]);
        }
        n_valid[q] = r.start + r.count - n_ahead + n_agree;
        k += static_cast<size_t>(r.n_logits);
      }
      rows.clear();
      n_rows = 0;
    };
    bool any = false;
    for (size_t q = 0; q < n_q; ++q) {
      if (feed[q].empty()) continue;
      any = true;
      const int64_t n_feed = std::ssize(feed[q]);
      const int64_t n_logits = queries[q].n_draft > 0 ? 1 + n_lookahead[q] : 0;
      for (int64_t i = 0; i < n_feed;) {
        int64_t count = std::min(n_feed - i, config_.max_batch_rows - n_rows);
        if (i + count < n_feed) count = std::min(count, n_feed - n_logits - i);  // no guessing row
        if (count <= 0) {
          flush();
          continue;
        }
        const bool last = i + count == n_feed;
        rows.push_back({q, n_valid[q] + i, count, feed[q].data() + i, last ? n_logits : 0});
        n_rows += count;
        i += count;
      }
      if (n_logits == 0) n_valid[q] += n_feed;
    }
    flush();
    for (std::vector<int32_t>& f : feed) f.clear();  // (the passes read them)
    if (!any) break;
  }
  for (size_t q = 0; q < n_q; ++q) {
    if (n_known[q] == 0) continue;
    SequenceDraft& s = seqs_[queries[q].id];
    s.n_computed = n_known[q];
    const int64_t n_fed = std::clamp<int64_t>(n_valid[q] - n_known[q], 0, std::ssize(queries[q].drafts));
    s.speculative.assign(queries[q].drafts.begin(), queries[q].drafts.begin() + n_fed);
  }
}

}  // namespace ember
