// engine/batch.h: the input of one batched forward pass over many sequences of the paged KV
// cache — flat arrays the model consumes as is. Built by build_batch() from a StepPlan; knows
// no requests or schedulers, only rows, positions, slots and block tables.
//
// Rows of one sequence are contiguous and in position order; sequences follow the plan's order.
// Invariants (checked by Batch::validate): for every sequence s and row r of it,
//   positions[r]    == s.start_pos + (r - s.row_begin)
//   slot_mapping[r] == table[positions[r] / block_size] * block_size + positions[r] % block_size
//                      where table = block_tables[s.block_table_begin .. + s.n_blocks]
//   s.n_blocks      == ceil((s.start_pos + s.n_rows) / block_size)  (the keys attention reads)
//   output_rows ascending; s.output_index >= 0 iff s's last row is among them, and then its
//   last 1 + n_drafts rows are output_rows[s.output_index, + 1 + n_drafts) (a row sampled for
//   the token after the last known one, then one per draft verified).
//   tokens of s's rows are token_history[positions], then its draft_tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache_manager.h"

namespace ember {

struct BatchSequence {
  SequenceId id = 0;
  int64_t row_begin = 0;          // first row of the sequence in tokens/positions/slot_mapping
  int64_t n_rows = 0;             // rows it computes this step (>= 1)
  int64_t start_pos = 0;          // position of its first row; the cache holds 0 .. start_pos-1
  int64_t block_table_begin = 0;  // its table is block_tables[block_table_begin, + n_blocks)
  int32_t lora_adapter = -1;      // the request's LoRA adapter (RequestOptions::lora_adapter), or -1
  float lora_scale = 1.0f;        // and the factor on its product
  int64_t n_blocks = 0;
  int64_t output_index = -1;                             // its first row in output_rows / the logits, or -1
                                                         // (mid-prefill chunk)
  std::span<const int32_t> token_history;                // every token known so far (for sampling penalties);
                                                         // valid until the scheduler's next update
  std::span<const int32_t> draft_tokens;                 // [n_drafts] guesses run after the known tokens (its
                                                         // last rows); valid like token_history
  std::span<const RequestImage> images;                  // the request's images (RequestOptions::images);
                                                         // valid like token_history
  int64_t n_keys() const { return start_pos + n_rows; }  // positions attention of the last row sees
  int64_t n_drafts() const { return static_cast<int64_t>(draft_tokens.size()); }
  int64_t n_known_keys() const { return n_keys() - n_drafts(); }  // rows' positions that are not drafts
  int64_t n_outputs() const { return output_index < 0 ? 0 : 1 + n_drafts(); }
  // The token of position pos < n_keys(): known, or a draft.
  int32_t token_at(int64_t pos) const {
    return pos < n_known_keys() ? token_history[pos] : draft_tokens[pos - n_known_keys()];
  }
};

struct Batch {
  int block_size = 0;
  std::vector<int32_t> tokens;        // [n_rows] token ids
  std::vector<int32_t> positions;     // [n_rows] position of each row in its sequence
  std::vector<int64_t> slot_mapping;  // [n_rows] cache slot each row's K/V is written to
  std::vector<int32_t> block_tables;  // [Σ n_blocks] every sequence's block table, concatenated
  std::vector<int32_t> output_rows;   // [n_outputs] ascending rows whose logits are sampled
  std::vector<BatchSequence> seqs;    // [n_seqs]
  // Copies of K/V rows between cache blocks, run before any row of the batch is written (the
  // rows a newly admitted sequence shares with a partially filled cached block).
  std::vector<BlockCopy> block_copies;
  // Blocks read from the disk cache, written (all their slots, every layer) before any row too.
  std::vector<BlockLoad> block_loads;

  int64_t n_rows() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_outputs() const { return static_cast<int64_t>(output_rows.size()); }
  std::span<const int32_t> block_table(const BatchSequence& s) const {
    return std::span<const int32_t>(block_tables).subspan(s.block_table_begin, s.n_blocks);
  }
  // Throws std::logic_error naming the first broken invariant (see the top of this file).
  void validate() const;
};

}  // namespace ember
