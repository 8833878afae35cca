// model/run_state.h: the mutable state of a forward pass — the activation scratch of one
// micro-batch, allocated once, never per token — and the batch it runs (the KV cache itself is
// kv/PagedKVCache).
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/moe.h"

namespace ember {

// Activations of a micro-batch of up to n_batch rows.
struct Scratch {
  int64_t n_batch = 0;
  // The passes' outputs are the output rows' final (normed) states [n_outputs, n_embd], not logits:
  // an embedder's scratch (model/embedder.h); an encoder's always, as it has no output head.
  bool states = false;
  // Every pass on this scratch rotates with LongRoPE's long factors: its owner's cache serves
  // sequences past the model's original context (Model::uses_long_rope).
  bool long_rope = false;
  Buffer x;         // f32 [n_batch, n_embd] residual stream
  Buffer xn;        // f32 [n_batch, n_embd] normed block input, then a block's output
  Buffer x_out;     // f32 [n_batch, n_embd] residual of the output rows in the last layer
  Buffer q;         // f32 [n_batch, n_q_dim]
  Buffer k;         // f32 [n_batch, n_kv_dim]
  Buffer v;         // f32 [n_batch, n_kv_dim]
  Buffer attn;      // f32 [n_batch, n_q_dim] attention output, heads concatenated
  Buffer ffn_gate;  // f32 [n_batch, n_ff] gate projection, then silu(gate) * up
  Buffer ffn_up;    // f32 [n_batch, n_ff]
  Buffer logits;    // f32 [n_batch, n_vocab] logits of the output rows, before they go to the host
                    // (with `states`: their final states [n_batch, n_embd])
  MoeScratch moe;   // mixture-of-experts layers' buffers; empty for dense models

  LoraScratch lora;  // LoRA adapters' buffers and row groups; empty without adapters
  // Host: encoders' per-row ids (the ops copy host tables as they record them).
  std::vector<int32_t> token_types;  // [n_batch] bert's segment ids (0, or 1 for a pair's second text)
  std::vector<int32_t> key_bounds;   // [n_batch] the last position each row attends to
  std::vector<int32_t> row_ids;      // [n_batch] 0 .. n_batch - 1 (get_rows of consecutive rows)

  Scratch() = default;
  // states: see above (an encoder's scratch has them whatever it says).
  Scratch(Backend& backend, const ModelConfig& config, int64_t n_batch, bool states = false);
};

// The rows of one sequence in a forward batch: contiguous, in position order, each attending to
// the sequence's cached positions up to its own.
struct SequenceRows {
  int64_t row_begin = 0;
  int64_t n_rows = 0;
  KVView kv;  // layer 0 of the sequence's cache; layer il's K and V start il * kv_layer_stride
              // bytes further (as in kv/PagedKVCache)

  int32_t lora = -1;        // its LoRA adapter: an index into ForwardBatch::adapters, or -1
  float lora_scale = 1.0f;  // the factor on that adapter's product (alpha / rank comes on top)

  KVView layer(int64_t il, int64_t kv_layer_stride) const {
    KVView view = kv;
    view.k += il * kv_layer_stride;
    view.v += il * kv_layer_stride;
    return view;
  }
};

// Rows of a batch whose input is an embedding given by the caller instead of a token lookup (an
// image's tokens: the vision projector's output, which the model's embedding scale does not
// touch).
struct RowEmbeddings {
  const float* data = nullptr;    // [n_rows, n_embd] host memory
  const int32_t* rows = nullptr;  // [n_rows] strictly ascending batch rows they stand for
  int64_t n_rows = 0;
};

// One forward pass over rows of one or more sequences: the weight matmuls see all rows at once,
// while store_kv and attention run per sequence.
struct ForwardBatch {
  const int32_t* tokens = nullptr;     // [n_tokens]
  const int32_t* positions = nullptr;  // [n_tokens], each token's position in its sequence
  int64_t n_tokens = 0;                // 1 .. scratch n_batch
  const SequenceRows* seqs = nullptr;  // [n_seqs], covering the rows in order
  int64_t n_seqs = 0;
  int64_t kv_layer_stride = 0;           // bytes from one layer's K (or V) rows to the next
  const int32_t* output_rows = nullptr;  // [n_outputs] ascending rows whose logits are wanted
  int64_t n_outputs = 0;
  // Logits of the first n_vocab_rows tokens only (0: of all; else a multiple of kVocabRowsAlign):
  // a draft model's guesses skip the rare tokens' rows of the output head (engine/draft_model.h).
  int64_t n_vocab_rows = 0;
  // When set: the output rows' final normalized states too, [n_outputs, n_embd] (host memory),
  // which score tokens past n_vocab_rows against their rows of the output head.
  float* hidden = nullptr;

  // The LoRA adapters rows may name (SequenceRows::lora), [n_adapters]; the scratch must have
  // LoRA buffers for the largest rank among them (Scratch::lora).
  const LoraAdapter* const* adapters = nullptr;
  int64_t n_adapters = 0;
  // Each adapted row's low-rank product on its own (the runner's batch invariance, where the
  // backend's f32 matmul rounds a row differently with other rows beside it).
  bool lora_row_at_a_time = false;

  // Rows given as embeddings (RowEmbeddings), or null.
  const RowEmbeddings* embeddings = nullptr;
  // [n_tokens] the last position each row attends to (>= its own; the keys up to it are in the
  // batch or the cache), or null: its own position (causal). Gemma 3's image tokens see their
  // whole image. Decoders read it in every layer (model/blocks.h decoder_attention).
  const int32_t* key_bounds = nullptr;

  int64_t vocab_rows(int64_t n_vocab) const { return n_vocab_rows > 0 ? n_vocab_rows : n_vocab; }
};

// A prefix of the output head's rows is a view of it (rows_of) on every backend when its length is
// a multiple of this (the CPU packs 16 rows together).
inline constexpr int64_t kVocabRowsAlign = 64;

// Whether logits of the first `rows` of n_vocab tokens can be asked for: all of them, or a
// multiple of kVocabRowsAlign below that.
inline bool valid_vocab_rows(int64_t rows, int64_t n_vocab) {
  return rows == n_vocab || (rows > 0 && rows < n_vocab && rows % kVocabRowsAlign == 0);
}

}  // namespace ember
