// engine/batch_builder.cpp: StepPlan -> Batch (tokens, positions, slots, tables, output rows).
#include "engine/batch_builder.h"

#include <stdexcept>

#include "core/error.h"

namespace ember {

Batch build_batch(const StepPlan& plan, const Scheduler& scheduler) {
  const KVCacheManager& kv = scheduler.kv();
  Batch batch;
  batch.block_size = kv.block_size();
  batch.tokens.reserve(plan.n_tokens);
  batch.positions.reserve(plan.n_tokens);
  batch.slot_mapping.resize(plan.n_tokens);
  batch.seqs.reserve(plan.seqs.size());
  batch.block_copies = plan.block_copies;
  batch.block_loads = plan.block_loads;
  for (const ScheduledSequence& p : plan.seqs) {
    const Request* r = scheduler.find(p.id);
    const int64_t n_known = p.n_tokens - p.n_drafts();  // rows of known tokens, then the drafts
    if (!r || r->num_computed_tokens != p.start_pos || p.start_pos + n_known > r->n_tokens() ||
        (p.n_drafts() > 0 && (!p.needs_sample || n_known < 1))) {
      throw std::logic_error(cat("[batch] request ", p.id, " no longer matches the plan"));
    }
    BatchSequence s;
    s.id = p.id;
    s.row_begin = batch.n_rows();
    s.n_rows = p.n_tokens;
    s.start_pos = p.start_pos;
    s.token_history = r->token_ids;
    s.draft_tokens = p.draft_tokens;
    s.images = r->options.images;
    s.lora_adapter = r->options.lora_adapter;
    s.lora_scale = r->options.lora_scale;
    const auto table = kv.block_table(p.id);
    s.n_blocks = (s.n_keys() + batch.block_size - 1) / batch.block_size;
    if (s.n_blocks > static_cast<int64_t>(table.size())) {
      throw std::logic_error(
          cat("[batch] request ", p.id, " has ", table.size(), " blocks, needs ", s.n_blocks));
    }
    s.block_table_begin = static_cast<int64_t>(batch.block_tables.size());
    batch.block_tables.insert(batch.block_tables.end(), table.begin(), table.begin() + s.n_blocks);
    kv.slot_mapping(p.id, p.start_pos, p.n_tokens, batch.slot_mapping.data() + s.row_begin);
    for (int64_t i = 0; i < p.n_tokens; ++i) {
      batch.tokens.push_back(i < n_known ? r->token_ids[p.start_pos + i] : p.draft_tokens[i - n_known]);
      batch.positions.push_back(static_cast<int32_t>(p.start_pos + i));
    }
    if (p.needs_sample) {
      s.output_index = batch.n_outputs();
      // The last known token's row, then every draft's: each predicts the token after it.
      for (int64_t i = n_known - 1; i < p.n_tokens; ++i) {
        batch.output_rows.push_back(static_cast<int32_t>(s.row_begin + i));
      }
    }
    batch.seqs.push_back(s);
  }
  return batch;
}

}  // namespace ember
