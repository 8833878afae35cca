// engine/draft_model.cpp: greedy guesses from a draft model over its own paged KV cache.
#include "engine/draft_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "core/error.h"
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
        c.enable_prefix_caching = false;
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

void ModelDrafter::run(std::span<const Rows> rows, std::span<Query> queries,
                       std::span<const int32_t* const> tokens, std::vector<int32_t>& next,
                       std::vector<float>& prob) {
  const int64_t n_vocab = model_->config().n_vocab;
  tokens_.clear();
  positions_.clear();
  output_rows_.clear();
  seq_rows_.clear();
  for (const Rows& r : rows) {
    const int64_t row_begin = static_cast<int64_t>(tokens_.size());
    for (int64_t p = r.start; p < r.start + r.count; ++p) {
      tokens_.push_back(tokens[r.query][p]);
      positions_.push_back(static_cast<int32_t>(p));
    }
    seq_rows_.push_back({row_begin, r.count, cache_.layer(0, kv_.block_table(queries[r.query].id).data())});
    if (r.wants_logits) output_rows_.push_back(static_cast<int32_t>(tokens_.size() - 1));
  }
  const ModelConfig& c = model_->config();
  const bool part = vocab_rows_ < c.n_vocab;
  const auto begin = std::chrono::steady_clock::now();
  forward_rows(*model_, scratch_, tokens_, positions_, seq_rows_, cache_.layer_bytes(), output_rows_, logits_,
               vocab_rows_, part ? &hidden_ : nullptr);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - begin;
  // A new prompt's catch-up is a prefill (a GEMM over hundreds of rows): priced with it, a
  // guess's pass would look cheap per row and dear in fixed cost, so only drafting passes count.
  const bool drafting = std::ranges::none_of(queries, [](const Query& q) { return q.n_draft == 0; });
  if (drafting) cost_.add(static_cast<int64_t>(tokens_.size()), took.count());
  int64_t k = 0;
  for (const Rows& r : rows) {
    if (!r.wants_logits) continue;
    const float* row = logits_.data() + k * vocab_rows_;
    const float* top = std::max_element(row, row + vocab_rows_);
    int32_t best = static_cast<int32_t>(top - row);
    float max = *top;
    // The request's rare tokens, scored as the head would (its rows in f32 against the row's
    // final state; soft-capped where the model caps its logits).
    rare_logits_.clear();
    if (part) {
      const SequenceDraft& s = seqs_.at(queries[r.query].id);
      const float* h = hidden_.data() + k * c.n_embd;
      for (size_t i = 0; i < s.rare.size(); ++i) {
        const float* w = s.rare_rows.data() + i * static_cast<size_t>(c.n_embd);
        float part_sums[8] = {};  // eight independent sums, for the vector units
        int64_t e = 0;
        for (; e + 8 <= c.n_embd; e += 8) {
          for (int j = 0; j < 8; ++j) part_sums[j] += h[e + j] * w[e + j];
        }
        for (; e < c.n_embd; ++e) part_sums[0] += h[e] * w[e];
        float z = 0.0f;
        for (float v : part_sums) z += v;
        if (c.final_softcap > 0.0f) z = c.final_softcap * std::tanh(z / c.final_softcap);
        rare_logits_.push_back(z);
        if (z > max) {
          max = z;
          best = s.rare[i];
        }
      }
    }
    ++k;
    // The top token's softmax probability (over the tokens scored); logits 16 below the top add
    // < 1.2e-7 each, so the sum skips them (what they could add in all moves p by well under 1%).
    float sum = 0.0f;
    for (int64_t t = 0; t < vocab_rows_; ++t) {
      if (row[t] > max - 16.0f) sum += std::exp(row[t] - max);
    }
    for (float z : rare_logits_) {
      if (z > max - 16.0f) sum += std::exp(z - max);
    }
    next[r.query] = best;
    prob[r.query] = 1.0f / sum;
  }
}

void ModelDrafter::propose(std::span<Query> queries) {
  const size_t n_q = queries.size();
  std::vector<std::vector<int32_t>> work(n_q);  // each query's tokens, then its guesses so far
  std::vector<const int32_t*> token_ptrs(n_q);
  std::vector<int64_t> n_known(n_q), start(n_q);
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
    work[q].assign(query.tokens.begin(), query.tokens.end());
    work[q].reserve(static_cast<size_t>(n + query.n_draft));
    n_known[q] = n;
    start[q] = c;
    active[q] = true;
  }
  std::vector<int32_t> next(n_q, -1);
  std::vector<float> prob(n_q, 0.0f);
  // Catch-up: every active query's rows from its first invalid position to its last token, in
  // passes of at most max_batch_rows rows (a long prompt spreads over several).
  std::vector<Rows> rows;
  int64_t n_rows = 0;
  const auto flush = [&] {
    for (size_t q = 0; q < n_q; ++q) token_ptrs[q] = work[q].data();
    if (!rows.empty()) run(rows, queries, token_ptrs, next, prob);
    rows.clear();
    n_rows = 0;
  };
  for (size_t q = 0; q < n_q; ++q) {
    if (!active[q]) continue;
    for (int64_t p = start[q]; p < n_known[q];) {
      const int64_t count = std::min(n_known[q] - p, config_.max_batch_rows - n_rows);
      rows.push_back({q, p, count, p + count == n_known[q] && queries[q].n_draft > 0});
      n_rows += count;
      p += count;
      if (n_rows == config_.max_batch_rows) flush();
    }
  }
  flush();
  // Then one row per query and guess: each guess is fed back to get the next, until a query has
  // its drafts or its judge() ends them (next is -1 once a query is done).
  std::vector<int64_t> n_fed(n_q, 0);  // guesses fed back, whose K/V is valid if they come true
  for (int64_t round = 0;; ++round) {
    for (size_t q = 0; q < n_q; ++q) {
      if (!active[q] || next[q] < 0) continue;
      Query& query = queries[q];
      const int32_t guess = std::exchange(next[q], -1);
      const Query::Verdict verdict = query.judge ? query.judge(prob[q]) : Query::Verdict{true, true};
      if (!verdict.keep) continue;
      work[q].push_back(guess);
      query.drafts.push_back(guess);
      query.probabilities.push_back(prob[q]);
      if (verdict.more && static_cast<int64_t>(query.drafts.size()) < query.n_draft) {
        rows.push_back({q, n_known[q] + round, 1, true});
        ++n_fed[q];
      }
    }
    if (rows.empty()) break;
    flush();
  }
  for (size_t q = 0; q < n_q; ++q) {
    if (!active[q]) continue;
    SequenceDraft& s = seqs_[queries[q].id];
    s.n_computed = n_known[q];
    s.speculative.assign(queries[q].drafts.begin(), queries[q].drafts.begin() + n_fed[q]);
  }
}

}  // namespace ember
