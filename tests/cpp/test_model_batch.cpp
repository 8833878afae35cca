// tests/cpp/test_model_batch.cpp: batched forward passes over several sequences of a paged KV
// cache give the same logits as running each sequence alone, in one forward pass over a cache of
// its own. Drives forward() from model/forward.h directly (no Context / contiguous KVCache).
// Usage: test_model_batch MODEL.gguf (stories260K); the harness's protocol (see harness.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cpu/backend_cpu.h"
#include "engine/draft_model.h"
#include "engine/model_runner_forward.h"
#include "harness.h"
#include "kv/paged_kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "quant/types.h"

using namespace ember;

namespace {

std::string model_path() { return test::args().empty() ? "tests/data/stories260K.gguf" : test::args()[0]; }

// Largest |a - b| over n values.
float max_diff(const float* a, const float* b, int64_t n) {
  float worst = 0.0f;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

std::vector<int32_t> prompt(int64_t n, int32_t seed) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((seed * 131 + i * 37) % 500 + 3);
  return tokens;
}

// Three sequences in one paged cache with interleaved blocks: a single batch prefills all
// three (every row an output), then two decode batches add one token to each; a fourth
// sequence's prompt is split into a no-output chunk and a final chunk in separate batches.
// Every logit row matches evaluating the sequence alone (same f32 math, same f16 cache; only
// the matmul's row count differs, which may change summation order: tolerance 1e-4).
TEST(batched_sequences_match_each_sequence_alone) {
  auto model = Model::load(model_path(), ModelOptions{2});
  const int64_t n_vocab = model->config().n_vocab;
  const int64_t block_size = 4;
  PagedKVCache cache(model->backend(), model->config().n_layer, model->config().n_head_kv,
                     model->config().head_dim, 32, block_size);
  Scratch scratch(model->backend(), model->config(), 64);

  const std::vector<std::vector<int32_t>> prompts = {prompt(7, 1), prompt(1, 2), prompt(12, 3),
                                                     prompt(10, 4)};
  // Block tables interleave: sequence s owns blocks s, s + 4, s + 8, ...
  std::vector<std::vector<int32_t>> tables(4);
  for (int32_t s = 0; s < 4; ++s) {
    for (int32_t b = 0; b < 8; ++b) tables[s].push_back(s + 4 * b);
  }

  // Reference: each sequence alone, prompt then two decode tokens, in one forward pass with
  // every row an output, over a fresh cache of its own read contiguously (block_table nullptr:
  // position p is slot p).
  std::vector<std::vector<float>> reference(4);
  const std::vector<std::vector<int32_t>> decoded = {{5, 9}, {11, 13}, {17, 19}, {23, 29}};
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> all = prompts[s];
    all.insert(all.end(), decoded[s].begin(), decoded[s].end());
    const int64_t n = static_cast<int64_t>(all.size());
    PagedKVCache alone(model->backend(), model->config().n_layer, model->config().n_head_kv,
                       model->config().head_dim, 1, n);
    Scratch alone_scratch(model->backend(), model->config(), n);
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    SequenceRows seq;
    seq.n_rows = n;
    seq.kv = alone.layer(0, nullptr);
    ForwardBatch batch;
    batch.tokens = all.data();
    batch.positions = positions.data();
    batch.n_tokens = n;
    batch.seqs = &seq;
    batch.n_seqs = 1;
    batch.kv_layer_stride = alone.layer_bytes();
    batch.output_rows = positions.data();  // every row: 0, 1, ..., n - 1
    batch.n_outputs = n;
    validate_batch(*model, alone_scratch, batch);
    reference[s].resize(n * n_vocab);
    forward(*model, alone_scratch, batch, reference[s].data());
  }

  struct Row {
    int s;
    int64_t pos;
  };
  auto run = [&](const std::vector<std::pair<int, std::pair<int64_t, int64_t>>>& parts, bool outputs) {
    // parts: (sequence, [first position, end position)) of each sequence in the batch
    std::vector<int32_t> tokens, positions, output_rows;
    std::vector<SequenceRows> seqs;
    std::vector<Row> rows;
    for (const auto& [s, range] : parts) {
      SequenceRows seq;
      seq.row_begin = static_cast<int64_t>(tokens.size());
      seq.n_rows = range.second - range.first;
      seq.kv = cache.layer(0, tables[s].data());
      seqs.push_back(seq);
      for (int64_t p = range.first; p < range.second; ++p) {
        const int64_t n_prompt = static_cast<int64_t>(prompts[s].size());
        tokens.push_back(p < n_prompt ? prompts[s][p] : decoded[s][p - n_prompt]);
        positions.push_back(static_cast<int32_t>(p));
        if (outputs) output_rows.push_back(static_cast<int32_t>(rows.size()));
        rows.push_back({s, p});
      }
    }
    ForwardBatch batch;
    batch.tokens = tokens.data();
    batch.positions = positions.data();
    batch.n_tokens = static_cast<int64_t>(tokens.size());
    batch.seqs = seqs.data();
    batch.n_seqs = static_cast<int64_t>(seqs.size());
    batch.kv_layer_stride = cache.layer_bytes();
    batch.output_rows = output_rows.data();
    batch.n_outputs = static_cast<int64_t>(output_rows.size());
    validate_batch(*model, scratch, batch);
    std::vector<float> logits(output_rows.size() * n_vocab);
    forward(*model, scratch, batch, logits.data());
    for (size_t i = 0; i < output_rows.size(); ++i) {
      const Row& row = rows[output_rows[i]];
      const float diff = max_diff(logits.data() + i * n_vocab, reference[row.s].data() + row.pos * n_vocab,
                                  n_vocab);
      if (!(diff < 1e-4f)) FAIL(cat("sequence ", row.s, " position ", row.pos, ": max |diff| ", diff));
    }
  };

  run({{0, {0, 7}}, {1, {0, 1}}, {2, {0, 12}}, {3, {0, 6}}}, /*outputs=*/true);
  run({{3, {6, 10}}}, /*outputs=*/false);                               // the rest of sequence 3's prompt
  run({{0, {7, 8}}, {1, {1, 2}}, {2, {12, 13}}, {3, {10, 11}}}, true);  // decode
  run({{2, {13, 14}}, {0, {8, 9}}, {3, {11, 12}}, {1, {2, 3}}}, true);  // decode, another order
}

TEST(invalid_batches_are_refused) {
  auto model = Model::load(model_path(), ModelOptions{1});
  Scratch scratch(model->backend(), model->config(), 8);
  const int32_t tokens[3] = {1, 2, 3};
  int32_t positions[3] = {0, 1, 2};
  SequenceRows seq;
  seq.n_rows = 3;
  ForwardBatch batch;
  batch.tokens = tokens;
  batch.positions = positions;
  batch.n_tokens = 3;
  batch.seqs = &seq;
  batch.n_seqs = 1;
  validate_batch(*model, scratch, batch);  // fine as is
  auto refused = [&](const char* needle) {
    CHECK_THROWS(InvalidArgument, validate_batch(*model, scratch, batch), needle);
  };
  positions[2] = 5;
  refused("positions of a sequence must be consecutive");
  positions[2] = 2;
  seq.n_rows = 2;
  refused("cover 2 of the batch's 3 rows");
  seq.n_rows = 3;
  const int32_t bad_outputs[2] = {2, 1};
  batch.output_rows = bad_outputs;
  batch.n_outputs = 2;
  refused("strictly ascending");
  batch.n_outputs = 0;
  batch.n_vocab_rows = 65;
  refused("a multiple of 64");
  batch.n_vocab_rows = 0;
  batch.n_tokens = 9;
  refused("expected 1 to 8");
}

// Part of the vocabulary (a draft model's guesses): the logits of the first n_vocab_rows tokens
// are the whole pass's first logits, bit for bit (the same matmul on a view of the head's first
// rows), and the final states given beside them score every other token as the head does (its
// f32 rows against them; summation order only: tolerance 1e-4).
TEST(part_of_the_vocabulary_and_the_final_states) {
  auto model = Model::load(model_path(), ModelOptions{2});
  const ModelConfig& c = model->config();
  const std::vector<int32_t> tokens = prompt(9, 5);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<int32_t> outputs = {3, 8};
  auto run = [&](int64_t n_vocab_rows, std::vector<float>* hidden) {
    PagedKVCache cache(model->backend(), c.n_layer, c.n_head_kv, c.head_dim, 1, n);
    Scratch scratch(model->backend(), c, n);
    const SequenceRows seq{0, n, cache.layer(0, nullptr)};
    std::vector<float> logits;
    forward_rows(*model, scratch, tokens, positions, std::span(&seq, 1), cache.layer_bytes(), outputs, logits,
                 n_vocab_rows, hidden);
    return logits;
  };
  const std::vector<float> all = run(0, nullptr);
  std::vector<float> hidden;
  const std::vector<float> part = run(64, &hidden);
  CHECK_EQ(std::ssize(part), 2 * 64);
  CHECK_EQ(std::ssize(hidden), 2 * c.n_embd);
  const GGUFTensorInfo* head = model->file().find_tensor(model->weights().tied_output ? "token_embd.weight"
                                                                                      : "output.weight");
  std::vector<float> w(static_cast<size_t>(c.n_embd));
  for (int64_t k = 0; k < 2; ++k) {
    CHECK(std::memcmp(part.data() + k * 64, all.data() + k * c.n_vocab, 64 * sizeof(float)) == 0);
    float worst = 0.0f;
    for (int64_t t = 0; t < c.n_vocab; ++t) {
      type_traits(head->type)
          .dequantize_row(head->data + t * row_bytes(head->type, c.n_embd), w.data(), c.n_embd);
      double z = 0.0;
      for (int64_t e = 0; e < c.n_embd; ++e) z += double{hidden[k * c.n_embd + e]} * w[e];
      worst = std::max(worst, std::fabs(static_cast<float>(z) - all[k * c.n_vocab + t]));
    }
    if (!(worst < 1e-4f)) FAIL(cat("output ", k, ": the states score the head's tokens ", worst, " off"));
  }
}

// A fresh draft model's guesses for one request of `text` (all n_draft of them, checked), and the
// forward passes it ran for them.
struct Drafted {
  DraftModel::Query query;
  int64_t n_passes;
};
Drafted draft_once(std::shared_ptr<const Model> model, DraftModelConfig config,
                   const std::vector<int32_t>& text, int64_t n_draft) {
  config.n_blocks = 64;
  config.block_size = 16;
  ModelDrafter drafter(std::move(model), config);
  std::vector<DraftModel::Query> queries(1);
  queries[0].id = 1;
  queries[0].tokens = text;
  queries[0].n_draft = n_draft;
  drafter.propose(queries);
  CHECK_EQ(std::ssize(queries[0].drafts), n_draft);
  return {queries[0], drafter.n_passes()};
}

// A draft model that scores the first 64 tokens and its request's own rarer ones guesses what one
// scoring every token guesses when the request's text holds every token (stories260K: all 512),
// and where it holds few, guesses only among those and the first 64.
TEST(a_draft_model_scores_part_of_the_vocabulary_and_the_requests_own_tokens) {
  auto model = std::shared_ptr<const Model>(Model::load(model_path(), ModelOptions{2}));
  const int64_t n_vocab = model->config().n_vocab;
  auto guesses = [&](int64_t vocab_rows, const std::vector<int32_t>& text) {
    DraftModelConfig config;
    config.vocab_rows = vocab_rows;
    return draft_once(model, config, text, 8).query;
  };
  std::vector<int32_t> every(static_cast<size_t>(n_vocab - 3));  // each token but the 3 special ones
  std::iota(every.begin(), every.end(), 3);
  for (size_t i = 0; i < every.size(); ++i) std::swap(every[i], every[(i * 7919) % every.size()]);
  const std::vector<int32_t> story = prompt(40, 7);
  every.insert(every.end(), story.begin(), story.end());
  const DraftModel::Query whole = guesses(0, every), part = guesses(64, every);
  CHECK(whole.drafts == part.drafts);
  for (size_t j = 0; j < 8; ++j) CHECK(std::fabs(whole.probabilities[j] - part.probabilities[j]) < 1e-4f);

  const std::vector<int32_t> few = prompt(40, 7);
  const DraftModel::Query narrow = guesses(64, few);
  for (int32_t t : narrow.drafts) CHECK(t < 64 || std::ranges::find(few, t) != few.end());
  CHECK(narrow.drafts != guesses(0, few).drafts);  // the restriction mattered here
}

// Staged drafting guesses what a pass per guess guesses, in fewer passes where prompt lookup
// foresees the guesses: stories260K continuing its own story (greedy from BOS: "Once upon a time,
// there was a little girl named Lily. She loved to play outside in the park. ..."), whose words
// repeat.
TEST(staged_drafting_guesses_what_a_pass_per_guess_does) {
  auto model = std::shared_ptr<const Model>(Model::load(model_path(), ModelOptions{2}));
  auto draft = [&](int64_t lookahead, const std::vector<int32_t>& text, int64_t n_draft) {
    DraftModelConfig config;
    config.lookahead = lookahead;
    return draft_once(model, config, text, n_draft);
  };
  std::vector<int32_t> story = {1};  // BOS
  const Drafted start = draft(0, story, 100);
  CHECK_EQ(start.n_passes, 100);  // the catch-up pass gives the first guess, then a pass per guess
  story.insert(story.end(), start.query.drafts.begin(), start.query.drafts.end());
  const Drafted one = draft(0, story, 48), staged = draft(8, story, 48);
  CHECK(one.query.drafts == staged.query.drafts);
  for (size_t j = 0; j < one.query.drafts.size(); ++j) {
    CHECK(std::fabs(one.query.probabilities[j] - staged.query.probabilities[j]) < 1e-4f);
  }
  CHECK_EQ(one.n_passes, 48);
  if (!(staged.n_passes < 40)) FAIL(cat("staged drafting took ", staged.n_passes, " passes for 48 guesses"));
}

// One engine step's Batch: each sequence computes tokens[start, end) of its history, with block
// table blocks(seq), and outputs its last row.
struct StepSeq {
  SequenceId id;
  const std::vector<int32_t>* history;
  int64_t start, end;
  std::vector<int32_t> table;
};

Batch make_step(int block_size, const std::vector<StepSeq>& seqs) {
  Batch b;
  b.block_size = block_size;
  for (const StepSeq& s : seqs) {
    BatchSequence bs;
    bs.id = s.id;
    bs.row_begin = b.n_rows();
    bs.n_rows = s.end - s.start;
    bs.start_pos = s.start;
    bs.block_table_begin = static_cast<int64_t>(b.block_tables.size());
    bs.n_blocks = (s.end + block_size - 1) / block_size;
    bs.token_history = std::span<const int32_t>(s.history->data(), static_cast<size_t>(s.end));
    for (int64_t i = 0; i < bs.n_blocks; ++i) b.block_tables.push_back(s.table[i]);
    for (int64_t p = s.start; p < s.end; ++p) {
      b.tokens.push_back((*s.history)[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(int64_t{s.table[p / block_size]} * block_size + p % block_size);
    }
    bs.output_index = b.n_outputs();
    b.output_rows.push_back(static_cast<int32_t>(b.n_rows() - 1));
    b.seqs.push_back(bs);
  }
  b.validate();
  return b;
}

// The runner pads steps to the backend's matmul_exact_min_rows (the largest over the model's
// weight types), so a sequence decoding alone (one row) gets the same bits as when it decodes
// among others: the top-8 logprobs of its next token must be equal float for float. The check is
// meaningful only where the answer exceeds 1 (stories260K's f32 weights take vec_dot below the
// GEMM's row count), so the test also checks that padding is needed there: without it, the lone
// row's logits differ (forward() called directly on one row shows it).
TEST(runner_rows_do_not_depend_on_the_batch) {
  auto model = Model::load(model_path(), ModelOptions{2});
  const int64_t min_rows = model->backend().matmul_exact_min_rows(model->weights().output.type);
  ForwardRunnerConfig config;
  config.n_blocks = 16;
  config.block_size = 4;
  config.max_batch_tokens = 32;
  config.parallel = 4;
  RequestOptions options;
  options.n_logprobs = 8;
  const std::vector<int32_t> a = prompt(6, 1), b = prompt(9, 2), c = prompt(5, 3);
  const std::vector<int32_t> table_a = {0, 1, 2}, table_b = {3, 4, 5}, table_c = {6, 7};
  auto top_of = [](const std::vector<SampledTokens>& sampled, size_t i) {
    CHECK(sampled.at(i).logprobs.size() == 1);
    return sampled[i].logprobs[0].top;
  };
  // Alone: prefill a[0, 5), then decode a[5] as a step of one row.
  ForwardRunner alone(model, config);
  alone.add(1, options);
  alone.execute(make_step(4, {{1, &a, 0, 5, table_a}}));
  const auto want = top_of(alone.execute(make_step(4, {{1, &a, 5, 6, table_a}})), 0);
  // Together: the same prefill, then a[5] decoded in one step with b's and c's prompts.
  ForwardRunner together(model, config);
  for (RequestId id : {1, 2, 3}) together.add(id, options);
  together.execute(make_step(4, {{1, &a, 0, 5, table_a}}));
  const auto got = top_of(together.execute(make_step(
                              4, {{2, &b, 0, 9, table_b}, {1, &a, 5, 6, table_a}, {3, &c, 0, 5, table_c}})),
                          1);
  CHECK(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(want[i].first == got[i].first);
    CHECK(std::memcmp(&want[i].second, &got[i].second, sizeof(float)) == 0);
  }
  // Where the backend says rows differ below min_rows, a lone row's logits must really differ
  // from a padded one's (else the padding, and this test, would prove nothing).
  if (min_rows > 1) {
    const int64_t n_vocab = model->config().n_vocab;
    PagedKVCache cache(model->backend(), model->config().n_layer, model->config().n_head_kv,
                       model->config().head_dim, 8, 4);
    Scratch scratch(model->backend(), model->config(), 8);
    std::vector<float> one(n_vocab), many(min_rows * n_vocab);
    auto run = [&](int64_t n_rows, float* logits) {
      std::vector<int32_t> tokens(a.begin(), a.begin() + n_rows), positions(n_rows), outputs(n_rows);
      std::vector<SequenceRows> rows;
      const std::vector<int32_t> tables[2] = {{0, 1}, {2, 3}};
      for (int64_t r = 0; r < n_rows; ++r) {
        positions[r] = 0;  // each row its own sequence at position 0: the rows are independent
        outputs[r] = static_cast<int32_t>(r);
        rows.push_back({r, 1, cache.layer(0, tables[r % 2].data())});
      }
      ForwardBatch fb;
      fb.tokens = tokens.data();
      fb.positions = positions.data();
      fb.n_tokens = n_rows;
      fb.seqs = rows.data();
      fb.n_seqs = n_rows;
      fb.kv_layer_stride = cache.layer_bytes();
      fb.output_rows = outputs.data();
      fb.n_outputs = n_rows;
      forward(*model, scratch, fb, logits);
    };
    run(1, one.data());
    run(min_rows, many.data());
    CHECK(std::memcmp(one.data(), many.data(), n_vocab * sizeof(float)) != 0);
  }
}

// The runner's steps never grow the backend's matmul workspace: it was sized at load (from the
// runner's scratch) for the largest step.
TEST(runner_steps_never_allocate_matmul_scratch) {
  auto model = Model::load(model_path(), ModelOptions{2});
  ForwardRunnerConfig config;
  config.n_blocks = 16;
  config.block_size = 4;
  config.max_batch_tokens = 24;
  config.parallel = 4;
  ForwardRunner runner(model, config);
  const auto* cpu = dynamic_cast<const CpuBackend*>(&model->backend());
  CHECK(cpu != nullptr);
  const int64_t n_allocations = cpu->matmul_workspace().n_allocations();
  const std::vector<int32_t> a = prompt(24, 1), b = prompt(3, 2);
  runner.add(1, {});
  runner.add(2, {});
  runner.execute(make_step(4, {{1, &a, 0, 21, {0, 1, 2, 3, 4, 5}}, {2, &b, 0, 3, {6}}}));  // 24 rows
  runner.execute(make_step(4, {{1, &a, 21, 22, {0, 1, 2, 3, 4, 5}}}));                     // 1 row
  CHECK(cpu->matmul_workspace().n_allocations() == n_allocations);
}

}  // namespace
