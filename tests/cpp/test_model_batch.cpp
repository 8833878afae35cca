// tests/cpp/test_model_batch.cpp: batched forward passes over several sequences of a paged KV
// cache give the same logits as running each sequence alone, in one forward pass over a cache of
// its own. Drives forward() from model/forward.h directly (no Context / contiguous KVCache).
// Usage: test_model_batch MODEL.gguf (stories260K); the harness's protocol (see harness.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "harness.h"
#include "kv/paged_kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

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
  PagedKVCache cache(model->backend(), model->config().n_layer, model->config().n_kv_dim(), 32, block_size);
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
    PagedKVCache alone(model->backend(), model->config().n_layer, model->config().n_kv_dim(), 1, n);
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
  batch.n_tokens = 9;
  refused("expected 1 to 8");
}

}  // namespace
