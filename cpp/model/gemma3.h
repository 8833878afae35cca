// model/gemma3.h: the forward pass of Gemma 3 and Gemma 2 (gemma3, gemma2 in GGUF).
#pragma once

#include "model/model.h"
#include "model/run_state.h"

namespace ember {

// As llama_forward (model/llama.h), for Gemma 3: embeddings scaled by sqrt(n_embd); RMSNorm
// before and after attention and feed-forward (GGUF norm weights already hold Gemma's 1 + w);
// Q/K RMSNorm per head; GeGLU (tanh gelu); sliding-window layers with their own RoPE base,
// interleaved with global ones (ModelConfig::is_swa); the tied output matrix. Gemma 2: no Q/K
// norms, attention scores and logits soft-capped (ModelConfig::attn_softcap, final_softcap).
void gemma3_forward(const Model& model, Scratch& scratch, const ForwardBatch& batch, float* logits);

}  // namespace ember
