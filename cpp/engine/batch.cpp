// engine/batch.cpp: the structural checks of a Batch (used by tests and debug runners).
#include "engine/batch.h"

#include <stdexcept>

#include "core/error.h"

namespace ember {

void Batch::validate() const {
  const auto fail = [](const auto&... what) {
    throw std::logic_error(cat("[batch] invariant broken: ", what...));
  };
  if (block_size < 1) fail("block_size ", block_size);
  for (const BlockCopy& c : block_copies) {
    if (c.src < 0 || c.dst < 0 || c.src == c.dst || c.n_slots < 1 || c.n_slots >= block_size)
      fail("a copy of ", c.n_slots, " slots from block ", c.src, " to block ", c.dst);
  }
  if (positions.size() != tokens.size() || slot_mapping.size() != tokens.size()) {
    fail(tokens.size(), " tokens, ", positions.size(), " positions, ", slot_mapping.size(), " slots");
  }
  int64_t next_row = 0, next_table = 0, next_output = 0;
  for (const BatchSequence& s : seqs) {
    if (s.row_begin != next_row || s.n_rows < 1)
      fail("sequence ", s.id, " rows [", s.row_begin, ", +", s.n_rows, ")");
    if (s.block_table_begin != next_table) fail("sequence ", s.id, " table starts at ", s.block_table_begin);
    if (s.n_blocks != (s.n_keys() + block_size - 1) / block_size) {
      fail("sequence ", s.id, " has ", s.n_blocks, " blocks for ", s.n_keys(), " positions");
    }
    if (static_cast<int64_t>(s.token_history.size()) < s.n_known_keys())
      fail("sequence ", s.id, " history too short");
    if (s.n_drafts() >= s.n_rows || (s.n_drafts() > 0 && s.output_index < 0))
      fail("sequence ", s.id, " has ", s.n_drafts(), " drafts in ", s.n_rows, " rows");
    const auto table = block_table(s);
    for (int64_t i = 0; i < s.n_rows; ++i) {
      const int64_t r = s.row_begin + i, pos = s.start_pos + i;
      if (positions[r] != pos) fail("row ", r, " has position ", positions[r], ", expected ", pos);
      if (tokens[r] != s.token_at(pos)) fail("row ", r, " token differs from the history and drafts");
      const int64_t slot = int64_t{table[pos / block_size]} * block_size + pos % block_size;
      if (slot_mapping[r] != slot) fail("row ", r, " slot ", slot_mapping[r], ", its table says ", slot);
    }
    if (s.output_index >= 0) {
      if (s.output_index != next_output) fail("sequence ", s.id, " output index ", s.output_index);
      const int64_t first_row = s.row_begin + s.n_rows - s.n_outputs();
      for (int64_t j = 0; j < s.n_outputs(); ++j) {
        if (output_rows.at(next_output + j) != first_row + j)
          fail("sequence ", s.id, " output ", j, " is row ", output_rows[next_output + j]);
      }
      next_output += s.n_outputs();
    }
    next_row += s.n_rows;
    next_table += s.n_blocks;
  }
  if (next_row != n_rows() || next_table != static_cast<int64_t>(block_tables.size()) ||
      next_output != n_outputs()) {
    fail("sequences cover ", next_row, " rows, ", next_table, " table entries, ", next_output, " outputs of ",
         n_rows(), ", ", block_tables.size(), ", ", n_outputs());
  }
}

}  // namespace ember
