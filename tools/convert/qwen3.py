"""Qwen3 (GGUF architecture "qwen3"): Llama's layout with per-head RMS norms on Q and K
(attn_q_norm / attn_k_norm), an explicit head_dim, no biases and no Q/K permutation."""

from __future__ import annotations

from .base import DecoderFamily
from .registry import register


@register("Qwen3ForCausalLM", "Qwen3ForSequenceClassification")
class Qwen3Family(DecoderFamily):
    gguf_arch = "qwen3"
    qk_norm = True
