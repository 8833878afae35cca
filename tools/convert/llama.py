"""Llama and Mistral (GGUF architecture "llama"): Q/K rows permuted to llama.cpp's RoPE layout,
optional attention biases, linear / yarn / llama3 RoPE scaling (llama3 as rope_freqs.weight), and
Mistral's sliding window over every layer as llama.attention.sliding_window (the key other
architectures use; llama.cpp's llama code does not read it and attends globally)."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFWriter

from .base import DecoderFamily, ExtraTensor, HParams
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register


@register("LlamaForCausalLM", "MistralForCausalLM", "LlamaForSequenceClassification")
class LlamaFamily(DecoderFamily):
    gguf_arch = "llama"
    permute_qk = True
    qkv_bias = "optional"
    rope_scaling_types = ("linear", "yarn", "llama3")

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)
        window = config.get("sliding_window")
        if window is not None and (not isinstance(window, int) or window <= 0):
            raise ConvertError(f"{where}: sliding_window is {window!r}, expected a positive integer")
        self.sliding_window = window or 0

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        if self.sliding_window:
            w.add_sliding_window(self.sliding_window)

    def extra_tensors(self) -> list[ExtraTensor]:
        if self.hp.rope_scaling.get("rope_type") != "llama3":
            return []
        n_rot = self.hp.head_dim
        return [ExtraTensor("rope_freqs.weight", (n_rot // 2,), self._llama3_rope_factors)]

    def _llama3_rope_factors(self) -> np.ndarray:
        hp = self.hp
        return llama3_rope_factors(hp.rope_theta if hp.rope_theta is not None else 10000.0, hp.head_dim,
                                   hp.rope_scaling)


def llama3_rope_factors(rope_theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: rope_freqs.weight [head_dim / 2],
    f32, the divisor of each RoPE frequency for Llama 3.1's long-context scaling (rope_scaling's
    factor, low_freq_factor, high_freq_factor and original_max_position_embeddings)."""
    freqs = 1.0 / (np.float32(rope_theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = scaling.get("factor", 8.0)
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
