"""Qwen2 (GGUF architecture "qwen2"): Llama's layout plus Q/K/V biases; no Q/K permutation
(llama.cpp runs qwen2 with NeoX-style RoPE, which is HF's rotate-half order)."""

from __future__ import annotations

from .base import DecoderFamily
from .registry import register


@register("Qwen2ForCausalLM", "Qwen2ForSequenceClassification")
class Qwen2Family(DecoderFamily):
    gguf_arch = "qwen2"
    qkv_bias = "required"
