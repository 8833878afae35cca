// engine/model_runner_forward.cpp: Batch -> ForwardBatch over the paged cache -> forward ->
// the next token (and optional logprobs) of each sampled sequence, after its accepted drafts.
#include "engine/model_runner_forward.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "kv/block_hash.h"
#include "model/forward.h"

namespace ember {
namespace {

// The row count from which every matmul of the model's forward pass gives each row the same
// bits whatever the batch (the largest of the backend's answers for the model's weight types).
int64_t matmul_exact_min_rows(const Model& model) {
  const Backend& be = model.backend();
  const ModelWeights& w = model.weights();
  int64_t n = be.matmul_exact_min_rows(w.output.type);
  for (const LayerWeights& l : w.layers) {
    std::vector<const WeightTensor*> tensors = {&l.wq,       &l.wk,     &l.wv,      &l.wo,
                                                &l.ffn_gate, &l.ffn_up, &l.ffn_down};
    for (const WeightTensor* t : l.moe.matmul_weights()) tensors.push_back(t);
    for (const WeightTensor* t : tensors) {
      if (*t) n = std::max(n, be.matmul_exact_min_rows(t->type));  // absent: a MoE layer's dense ones
    }
  }
  return n;
}

}  // namespace

ForwardRunner::ForwardRunner(std::shared_ptr<const Model> model, const ForwardRunnerConfig& config,
                             std::vector<std::shared_ptr<const LoraAdapter>> adapters,
                             std::shared_ptr<VisionModel> vision)
    : model_(std::move(model)), config_(config), adapters_(std::move(adapters)), vision_(std::move(vision)) {
  if (!model_) throw InvalidArgument("[engine] the runner has no model");
  if (vision_ && vision_->config().n_embd_out != model_->config().n_embd) {
    throw InvalidArgument(cat("[engine] the vision projector ", vision_->file().path(),
                              " gives embeddings of ", vision_->config().n_embd_out, " values, the model ",
                              model_->file().path(), " takes ", model_->config().n_embd,
                              ": they are not one model's"));
  }
  if (config.max_batch_tokens < 1 || config.parallel < 1) {
    throw InvalidArgument(cat("[engine] max_batch_tokens (", config.max_batch_tokens, ") and parallel (",
                              config.parallel, ") must be >= 1"));
  }
  const ModelConfig& c = model_->config();
  if (c.is_encoder()) {
    throw InvalidArgument(cat("[engine] ", model_->file().path(), ": '", c.arch->name,
                              "' is an embedding model; it does not generate (embed with it instead)"));
  }
  if (config.n_blocks < 1 || config.block_size < 1) {
    throw InvalidArgument(cat("[engine] the KV cache needs n_blocks >= 1 and block_size >= 1, got ",
                              config.n_blocks, " and ", config.block_size));
  }
  min_rows_ = config.batch_invariant ? matmul_exact_min_rows(*model_) : 1;
  const int64_t n_pad_rows = min_rows_ - 1;  // at most this many throwaway rows per step
  const int64_t n_pad_blocks = (n_pad_rows + config.block_size - 1) / config.block_size;
  for (int64_t i = 0; i < n_pad_blocks; ++i) pad_table_.push_back(static_cast<int32_t>(config.n_blocks + i));
  PagedKVCache::check_type(config.kv_type, c.head_dim);
  cache_ = PagedKVCache(model_->backend(), c.n_layer, c.n_head_kv, c.head_dim, config.n_blocks + n_pad_blocks,
                        config.block_size, config.kv_type);
  // Room for the largest step plus its throwaway rows.
  const int64_t n_batch = config.max_batch_tokens + n_pad_rows;
  scratch_ = Scratch(model_->backend(), c, n_batch);
  scratch_.long_rope = model_->uses_long_rope(config.n_ctx);
  int64_t max_rank = 0;
  for (const auto& adapter : adapters_) {
    if (!adapter) throw InvalidArgument("[engine] a LoRA adapter is null");
    max_rank = std::max(max_rank, adapter->max_rank());
    adapter_ptrs_.push_back(adapter.get());
  }
  if (!adapters_.empty()) {
    scratch_.lora = LoraScratch(model_->backend(), c, n_batch, max_rank);
    lora_row_at_a_time_ = config.batch_invariant && model_->backend().matmul_exact_min_rows(DType::f32) > 1;
  }
  rows_.reserve(n_batch);
  logits_.reserve(static_cast<size_t>(config.parallel + n_pad_rows) * c.n_vocab);
}

const std::vector<float>& ForwardRunner::image_embeddings(const RequestImage& image) {
  auto it = std::find_if(image_cache_.begin(), image_cache_.end(),
                         [&](const auto& entry) { return entry.first == image.hash; });
  if (it != image_cache_.end()) {  // most recently used goes last
    std::rotate(it, it + 1, image_cache_.end());
    return image_cache_.back().second;
  }
  std::vector<float> e = vision_->encode(image.pixels->data(), image.width, image.height);
  ++n_images_encoded_;
  if (image_cache_.size() >= kImageCacheSize) image_cache_.erase(image_cache_.begin());
  image_cache_.emplace_back(image.hash, std::move(e));
  return image_cache_.back().second;
}

void ForwardRunner::validate(std::span<const int32_t> prompt, const RequestOptions& options) const {
  const int32_t n_vocab = static_cast<int32_t>(model_->config().n_vocab);
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= n_vocab) {
      throw InvalidRequest(cat("[request] prompt token ", i, " has id ", prompt[i],
                               ", outside the vocabulary [0, ", n_vocab, ")"));
    }
  }
  for (int32_t t : options.stop_token_ids) {
    if (t < 0 || t >= n_vocab) {
      throw InvalidRequest(
          cat("[request] stop token id ", t, " is outside the vocabulary [0, ", n_vocab, ")"));
    }
  }
  if (options.n_logprobs > n_vocab) {
    throw InvalidRequest(
        cat("[request] n_logprobs must be <= n_vocab (", n_vocab, "), got ", options.n_logprobs));
  }
  if (options.lora_adapter < -1 || options.lora_adapter >= static_cast<int32_t>(adapters_.size())) {
    throw InvalidRequest(cat("[request] LoRA adapter ", options.lora_adapter, " does not exist; ",
                             adapters_.size(), " adapters are loaded"));
  }
  if (!std::isfinite(options.lora_scale)) {
    throw InvalidRequest(cat("[request] the LoRA scale must be a finite number, got ", options.lora_scale));
  }
  if (!options.images.empty() && !vision_) {
    throw InvalidRequest("[request] the prompt has images, but the model has no vision projector (mmproj)");
  }
  for (size_t i = 0; i < options.images.size(); ++i) {
    const RequestImage& image = options.images[i];
    const VisionTower& tower = vision_->tower();
    const auto [w, h] = tower.preprocessed_size(image.width, image.height);
    if (!image.pixels || w != image.width || h != image.height ||
        static_cast<int64_t>(image.pixels->size()) != 3 * image.width * image.height) {
      throw InvalidRequest(cat("[request] image ", i, ": its pixels are not ",
                               vision_->config().projector_type, " preprocessed planes of ", w, "x", h));
    }
    if (image.n_tokens != tower.n_tokens(image.width, image.height)) {
      throw InvalidRequest(cat("[request] image ", i, " stands for ", image.n_tokens,
                               " prompt tokens; the "
                               "projector makes ",
                               tower.n_tokens(image.width, image.height), " of it"));
    }
  }
  ember::validate(options.sampling, n_vocab);
  if (options.grammar && options.grammar->n_vocab() > n_vocab) {
    throw InvalidRequest(cat("[request] the grammar was compiled for ", options.grammar->n_vocab(),
                             " tokens, the model has ", n_vocab));
  }
}

uint64_t ForwardRunner::cache_namespace(const RequestOptions& options) const {
  if (options.lora_adapter < 0) return 0;
  const int32_t scale = std::bit_cast<int32_t>(options.lora_scale);
  const BlockHash ns = hash_block(adapters_[static_cast<size_t>(options.lora_adapter)]->identity(),
                                  {&scale, 1});
  return ns == 0 ? 1 : ns;  // 0 is the model's own
}

void ForwardRunner::add(RequestId id, const RequestOptions& options) {
  const int32_t n_vocab = static_cast<int32_t>(model_->config().n_vocab);
  samplers_.erase(id);
  std::unique_ptr<TokenConstraint> constraint = options.grammar ? options.grammar->start() : nullptr;
  samplers_.emplace(
      id, SequenceSampler{Sampler(options.sampling, n_vocab, std::move(constraint), options.stop_token_ids),
                          options.n_logprobs, options.post_sampling_probs, 0});
}

void ForwardRunner::release(std::span<const SequenceId> ids) {
  for (SequenceId id : ids) samplers_.erase(id);
}

namespace {

// Calls f(first, count) for each run blocks[first .. first + count) of consecutive ids.
template <typename F>
void for_each_run(std::span<const int32_t> blocks, F f) {
  for (size_t first = 0, end; first < blocks.size(); first = end) {
    for (end = first + 1; end < blocks.size() && blocks[end] == blocks[end - 1] + 1;) ++end;
    f(first, end - first);
  }
}

}  // namespace

std::vector<std::vector<uint8_t>> ForwardRunner::read_blocks(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    if (b < 0 || b >= config_.n_blocks)
      throw std::logic_error(cat("[engine] read of block ", b, " of ", config_.n_blocks));
  }
  const size_t n = static_cast<size_t>(cache_.block_size * cache_.row_bytes);  // one block, one layer's K
  std::vector<std::vector<uint8_t>> out(blocks.size(), std::vector<uint8_t>(block_payload_bytes()));
  Backend& be = model_->backend();
  for_each_run(blocks, [&](size_t first, size_t count) {
    run_bytes_.resize(count * n);
    for (int64_t il = 0; il < cache_.n_layer; ++il) {
      const size_t at = static_cast<size_t>(il * cache_.layer_bytes()) +
                        static_cast<size_t>(blocks[first]) * n;
      for (int side = 0; side < 2; ++side) {
        be.download(side == 0 ? cache_.k : cache_.v, at, run_bytes_.data(), count * n);
        for (size_t j = 0; j < count; ++j) {
          std::memcpy(out[first + j].data() + (2 * il + side) * n, run_bytes_.data() + j * n, n);
        }
      }
    }
  });
  return out;
}

void ForwardRunner::write_blocks(std::span<const BlockLoad> loads) {
  std::vector<int32_t> blocks;
  for (const BlockLoad& l : loads) {
    if (l.dst < 0 || l.dst >= config_.n_blocks || !l.payload ||
        static_cast<int64_t>(l.payload->size()) != block_payload_bytes()) {
      throw std::logic_error(cat("[engine] write of ", l.payload ? l.payload->size() : 0, " bytes to block ",
                                 l.dst, " of ", config_.n_blocks, " (blocks take ", block_payload_bytes(),
                                 ")"));
    }
    blocks.push_back(l.dst);
  }
  const size_t n = static_cast<size_t>(cache_.block_size * cache_.row_bytes);
  Backend& be = model_->backend();
  for_each_run(blocks, [&](size_t first, size_t count) {
    run_bytes_.resize(count * n);
    for (int64_t il = 0; il < cache_.n_layer; ++il) {
      const size_t at = static_cast<size_t>(il * cache_.layer_bytes()) +
                        static_cast<size_t>(blocks[first]) * n;
      for (int side = 0; side < 2; ++side) {
        for (size_t j = 0; j < count; ++j) {
          std::memcpy(run_bytes_.data() + j * n, loads[first + j].payload->data() + (2 * il + side) * n, n);
        }
        be.upload(side == 0 ? cache_.k : cache_.v, at, run_bytes_.data(), count * n);
      }
    }
  });
}

std::vector<SampledTokens> ForwardRunner::execute(const Batch& batch) {
  const int64_t n_vocab = model_->config().n_vocab;
  if (batch.block_size != cache_.block_size) {
    throw std::logic_error(
        cat("[engine] the batch has blocks of ", batch.block_size, " tokens, the cache ", cache_.block_size));
  }
  // Rows of partial prefix hits, every layer, before this batch writes any row.
  for (const BlockCopy& c : batch.block_copies) {
    if (c.src < 0 || c.src >= config_.n_blocks || c.dst < 0 || c.dst >= config_.n_blocks || c.src == c.dst ||
        c.n_slots < 1 || c.n_slots > cache_.block_size) {
      throw std::logic_error(cat("[engine] a copy of ", c.n_slots, " slots from block ", c.src, " to block ",
                                 c.dst, " of ", config_.n_blocks));
    }
    for (int64_t il = 0; il < cache_.n_layer; ++il) {
      model_->backend().copy_kv(cache_.layer(il, nullptr), c.src, c.dst, c.n_slots);
    }
  }
  // Blocks of disk prefix hits: fresh blocks, so no copy above reads or writes them.
  write_blocks(batch.block_loads);
  const int64_t n_rows = batch.n_rows(), n_outputs = batch.n_outputs();
  tokens_.assign(batch.tokens.begin(), batch.tokens.end());
  positions_.assign(batch.positions.begin(), batch.positions.end());
  output_rows_.assign(batch.output_rows.begin(), batch.output_rows.end());
  rows_.clear();
  const auto add_rows = [&](int64_t row_begin, int64_t count, const int32_t* table, int32_t lora,
                            float scale) {
    const KVView kv = cache_.layer(0, table);
    if (config_.batch_invariant) {
      for (int64_t r = row_begin; r < row_begin + count; ++r) rows_.push_back({r, 1, kv, lora, scale});
    } else {
      rows_.push_back({row_begin, count, kv, lora, scale});
    }
  };
  for (const BatchSequence& s : batch.seqs) {
    for (int64_t i = 0; i < s.n_blocks; ++i) {
      const int32_t block = batch.block_tables[s.block_table_begin + i];
      // kNoBlock: released behind a sliding window that covers every layer, never read again.
      if (block != kNoBlock && (block < 0 || block >= config_.n_blocks)) {
        throw std::logic_error(
            cat("[engine] request ", s.id, " has block ", block, " of ", config_.n_blocks));
      }
    }
    add_rows(s.row_begin, s.n_rows, batch.block_tables.data() + s.block_table_begin, s.lora_adapter,
             s.lora_scale);
  }
  // Throwaway rows (token 0 at positions 0, 1, ... of the padding blocks) lift the batch, and its
  // outputs when it has any, to min_rows_; their logits are ignored.
  int64_t n_pad = std::max<int64_t>(0, min_rows_ - n_rows);
  if (n_outputs > 0) n_pad = std::max(n_pad, min_rows_ - n_outputs);
  for (int64_t i = 0; i < n_pad; ++i) {
    tokens_.push_back(0);
    positions_.push_back(static_cast<int32_t>(i));
    if (n_outputs > 0) output_rows_.push_back(static_cast<int32_t>(n_rows + i));
  }
  if (n_pad > 0) add_rows(n_rows, n_pad, pad_table_.data(), -1, 1.0f);

  // Image rows: the projector's embeddings instead of their (placeholder) tokens; where the
  // images attend both ways, each of their rows sees up to its image's last position (the
  // scheduler keeps an image's remaining rows in one chunk).
  embd_.clear();
  embd_rows_.clear();
  const bool both_ways = vision_ && vision_->tower().image_attends_both_ways();
  if (both_ways) key_bounds_.assign(positions_.begin(), positions_.end());
  const int64_t n_embd = model_->config().n_embd;
  for (const BatchSequence& s : batch.seqs) {
    const int64_t first = s.start_pos, end = s.start_pos + s.n_rows - s.n_drafts();
    for (const RequestImage& image : s.images) {
      const int64_t from = std::max(first, image.pos), to = std::min(end, image.end());
      if (from >= to) continue;
      const std::vector<float>& e = image_embeddings(image);
      for (int64_t pos = from; pos < to; ++pos) {
        const int64_t row = s.row_begin + (pos - first);
        embd_rows_.push_back(static_cast<int32_t>(row));
        const float* src = e.data() + (pos - image.pos) * n_embd;
        embd_.insert(embd_.end(), src, src + n_embd);
        if (both_ways) key_bounds_[row] = static_cast<int32_t>(image.end() - 1);
      }
    }
  }
  const RowEmbeddings embeddings{embd_.data(), embd_rows_.data(), static_cast<int64_t>(embd_rows_.size())};

  forward_rows(*model_, scratch_, tokens_, positions_, rows_, cache_.layer_bytes(), output_rows_, logits_, 0,
               nullptr, adapter_ptrs_, lora_row_at_a_time_, embd_rows_.empty() ? nullptr : &embeddings,
               both_ways && !embd_rows_.empty() ? key_bounds_.data() : nullptr);

  std::vector<SampledTokens> sampled;
  for (const BatchSequence& s : batch.seqs) {
    if (s.output_index < 0) continue;
    const auto it = samplers_.find(s.id);
    if (it == samplers_.end()) throw std::logic_error(cat("[engine] request ", s.id, " has no sampler"));
    SequenceSampler& seq = it->second;
    // The penalty window sees every token up to the sampled row's (prompt, then output), then
    // each draft accepted before the row that verifies the next.
    for (; seq.n_accepted < s.n_known_keys(); ++seq.n_accepted)
      seq.sampler.accept(s.token_history[seq.n_accepted]);
    SampledTokens& out = sampled.emplace_back();
    for (int64_t j = 0; j <= s.n_drafts(); ++j) {
      const float* row = logits_.data() + (s.output_index + j) * n_vocab;
      const bool is_draft_row = j < s.n_drafts();
      const int32_t token = is_draft_row ? seq.sampler.verify(row, s.draft_tokens[j])
                                         : seq.sampler.sample(row);
      out.tokens.push_back(token);
      if (seq.n_logprobs >= 0) {  // before advance: post-sampling values mask with this step's state
        out.logprobs.push_back(
            seq.post_sampling ? seq.sampler.post_sampling_logprobs(row, token, seq.n_logprobs)
                              : token_logprobs(row, static_cast<int32_t>(n_vocab), token, seq.n_logprobs));
      }
      // Every token kept becomes the request's next output (a preempted request recomputes its
      // tokens without sampling them again), so the constraint advances here, once per token,
      // before the next row is verified under its new state.
      seq.sampler.advance(token);
      if (!is_draft_row || token != s.draft_tokens[j]) break;
      // Accepted: it is the request's next token, and part of the history the next row sees.
      seq.sampler.accept(token);
      ++seq.n_accepted;
    }
  }
  return sampled;
}

}  // namespace ember
