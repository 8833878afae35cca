// tests/cpp/fake_runner.h: what the engine-core tests (test_block_pool, test_kv_cache_manager,
// test_scheduler, test_engine) share — token and config builders, and a fake model runner, so
// the block pool, KV manager, scheduler and engine loop are tested with no model.
//
// The fake runner stands in for the model with two properties the real one has:
//  * "KV": it makes the batch's block copies, writes, at each row's slot, a hash of the row's
//    whole token prefix, and before "attending" checks that every position the sequence reads
//    holds the hash of its own prefix — so a wrong block table, slot mapping, prefix hit,
//    reused block or block copy is caught;
//  * "sampling": the next token is a function of the sequence's whole history, so a request's
//    outputs are known in advance (reference_generate) and must not depend on batching,
//    chunking, prefix hits or preemption.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/batch_builder.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"

namespace ember {

// ---- token and config builders ----------------------------------------------------------------

inline std::vector<int32_t> iota_tokens(int64_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

inline KVCacheConfig kv_config(int64_t n_blocks, int block_size = 16, bool prefix_caching = true) {
  KVCacheConfig c;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.prefix_caching = prefix_caching;
  return c;
}

inline SchedulerConfig sched_config(int64_t budget = 512, int max_seqs = 16, int64_t max_model_len = 4096) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.parallel = max_seqs;
  c.max_model_len = max_model_len;
  return c;
}

inline RequestOptions opts(int64_t max_tokens, int priority = 0) {
  RequestOptions o;
  o.max_tokens = max_tokens;
  o.priority = priority;
  return o;
}

// ---- the fake model ---------------------------------------------------------------------------

inline uint64_t mix_token(uint64_t h, int32_t token) {
  uint64_t x = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9E3779B97F4A7C15ULL + (h << 6) +
                    (h >> 2));
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// prefix[p] = hash of tokens[0..p] — what a real cache row at position p depends on.
inline std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens, int64_t n) {
  std::vector<uint64_t> out(n);
  uint64_t h = 1469598103934665603ULL;
  for (int64_t p = 0; p < n; ++p) out[p] = h = mix_token(h, tokens[p]);
  return out;
}

inline constexpr int32_t kFirstToken = 100, kVocab = 900;

inline int32_t next_token(std::span<const int32_t> history) {
  const auto h = prefix_hashes(history, static_cast<int64_t>(history.size()));
  return kFirstToken + static_cast<int32_t>(h.back() % kVocab);
}

struct Generation {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::none;
};

// What a request must produce, computed one sequence at a time without any cache.
inline Generation reference_generate(std::span<const int32_t> prompt, const RequestOptions& options,
                                     int64_t max_model_len) {
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  Generation g;
  while (true) {
    const int32_t t = next_token(history);
    history.push_back(t);
    g.tokens.push_back(t);
    if (std::ranges::find(options.stop_token_ids, t) != options.stop_token_ids.end()) {
      g.reason = FinishReason::stop;
    } else if (static_cast<int64_t>(g.tokens.size()) >= options.max_tokens ||
               static_cast<int64_t>(history.size()) >= max_model_len) {
      g.reason = FinishReason::length;
    }
    if (g.reason != FinishReason::none) return g;
  }
}

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int64_t n_slots) : kv_(n_slots, 0) {}

  std::vector<SampledTokens> execute(const Batch& batch) override {
    batch.validate();
    ++n_steps;
    n_rows_total += batch.n_rows();
    for (const BlockCopy& c : batch.block_copies) {
      for (int64_t i = 0; i < c.n_slots; ++i) {
        kv_.at(int64_t{c.dst} * batch.block_size + i) = kv_.at(int64_t{c.src} * batch.block_size + i);
      }
      n_copied_slots += c.n_slots;
    }
    std::vector<SampledTokens> sampled;
    for (const BatchSequence& s : batch.seqs) {
      // The sequence's tokens as this step sees them: the known ones, then its drafts.
      std::vector<int32_t> tokens;
      for (int64_t p = 0; p < s.n_keys(); ++p) tokens.push_back(s.token_at(p));
      const auto prefix = prefix_hashes(tokens, s.n_keys());
      for (int64_t i = 0; i < s.n_rows; ++i) {
        kv_.at(batch.slot_mapping[s.row_begin + i]) = prefix[s.start_pos + i];
      }
      // "Attention": every key the last row reads must be this sequence's own prefix.
      const auto table = batch.block_table(s);
      for (int64_t p = 0; p < s.n_keys(); ++p) {
        const int64_t slot = int64_t{table[p / batch.block_size]} * batch.block_size + p % batch.block_size;
        if (kv_.at(slot) != prefix[p]) {
          throw std::logic_error(cat("[fake runner] sequence ", s.id, " reads a wrong K/V at position ", p));
        }
      }
      if (s.output_index < 0) continue;
      // Greedy verification: each draft is kept while it is the token the "model" would pick.
      SampledTokens& out = sampled.emplace_back();
      for (int64_t j = 0; j <= s.n_drafts(); ++j) {
        const int32_t t = next_token(std::span<const int32_t>(tokens).subspan(0, s.n_known_keys() + j));
        out.tokens.push_back(t);
        if (j == s.n_drafts() || t != s.draft_tokens[j]) break;
      }
      n_drafted += s.n_drafts();
      n_accepted += out.n_accepted();
    }
    if (!batch.output_rows.empty() && fail_next) {
      fail_next = false;
      throw std::runtime_error("fake runner failure");
    }
    if (step_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us));
    return sampled;
  }

  void release(std::span<const SequenceId> ids) override {
    released.insert(released.end(), ids.begin(), ids.end());
  }

  int64_t n_steps = 0, n_rows_total = 0, n_drafted = 0, n_accepted = 0, n_copied_slots = 0;
  std::atomic<bool> fail_next{false};
  int step_delay_us = 0;
  std::vector<SequenceId> released;

 private:
  std::vector<uint64_t> kv_;  // [n_slots] the prefix hash written at each cache slot
};

}  // namespace ember
