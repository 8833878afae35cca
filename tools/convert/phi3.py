"""Phi-3 (GGUF architecture "phi3"): Llama's block with Q, K and V fused into one projection
(attn_qkv) and the feed-forward's gate and up fused into one (ffn_up, gate rows first), as
llama.cpp's converter writes them; RoPE in the NeoX layout, partial when partial_rotary_factor
says so.

LongRoPE (the 128k-context Phi-3 / Phi-3.5 / Phi-4-mini models, rope_scaling type "longrope", or
its old name "su") as llama.cpp writes it: the short and long frequency divisors as the tensors
rope_factors_short.weight and rope_factors_long.weight [n_rot / 2], the original context as
rope.scaling.original_context_length (it decides which set a context uses), and the factor on
cos and sin as rope.scaling.attn_factor: the config's attention_factor, else
sqrt(1 + ln(scale) / ln(original context)) with scale = max_position_embeddings / original
context (the config's factor where it gives one), 1 when scale <= 1 — transformers' rule.
llama.cpp's converter always derives it from the two context lengths; for the published models,
which give neither factor nor attention_factor, the two agree."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFWriter

from .base import DecoderFamily, ExtraTensor, HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register


@register("Phi3ForCausalLM")
class Phi3Family(DecoderFamily):
    gguf_arch = "phi3"
    rope_scaling_types = ("linear", "longrope", "su")
    rope_scaling_without_factor = ("longrope", "su")

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)
        rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
        factor = float(rope.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0)
        self._n_rot = int(hp.head_dim * factor)
        if self._n_rot <= 0 or self._n_rot % 2 or self._n_rot > hp.head_dim:
            raise ConvertError(f"{where}: partial_rotary_factor {factor} gives {self._n_rot} rotated "
                               f"dimensions of {hp.head_dim}; expected an even count")
        self.short_factors: list[float] = []
        self.long_factors: list[float] = []
        self.original_ctx = (hp.rope_scaling.get("original_max_position_embeddings") or
                             config.get("original_max_position_embeddings"))
        self.attn_factor = 1.0
        if hp.rope_scaling.get("rope_type") in ("longrope", "su"):
            self._read_longrope(hp, where)

    def _read_longrope(self, hp: HParams, where: str) -> None:
        scaling = hp.rope_scaling
        n_pairs = self._n_rot // 2
        for key in ("short_factor", "long_factor"):
            values = scaling.get(key)
            if (not isinstance(values, list) or len(values) != n_pairs or
                    not all(isinstance(v, (int, float)) and v > 0 for v in values)):
                raise ConvertError(f"{where}: rope_scaling {key} is {values!r}, expected {n_pairs} "
                                   f"positive numbers (one per rotated dimension pair)")
        self.short_factors = [float(v) for v in scaling["short_factor"]]
        self.long_factors = [float(v) for v in scaling["long_factor"]]
        original = self.original_ctx
        if not isinstance(original, int) or original <= 1:
            raise ConvertError(f"{where}: LongRoPE needs original_max_position_embeddings, a "
                               f"positive integer; got {original!r}")
        given = scaling.get("attention_factor")
        if given is not None:
            if not isinstance(given, (int, float)) or given <= 0:
                raise ConvertError(f"{where}: rope_scaling attention_factor is {given!r}, "
                                   "expected a positive number")
            self.attn_factor = float(given)
            return
        scale = scaling.get("factor") or (hp.n_ctx or original) / original
        self.attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0

    @property
    def n_rot(self) -> int:
        return self._n_rot

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        if self.original_ctx is not None:
            w.add_rope_scaling_orig_ctx_len(int(self.original_ctx))
        if self.long_factors:
            w.add_rope_scaling_attn_factors(self.attn_factor)

    def extra_tensors(self) -> list[ExtraTensor]:
        if not self.long_factors:
            return []
        shape = (self._n_rot // 2,)
        return [
            ExtraTensor("rope_factors_long.weight", shape,
                        lambda: np.array(self.long_factors, dtype=np.float32)),
            ExtraTensor("rope_factors_short.weight", shape,
                        lambda: np.array(self.short_factors, dtype=np.float32)),
        ]

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.", f"blk.{i}."
        qkv_rows = (hp.n_head + 2 * hp.n_head_kv) * hp.head_dim
        return [
            TensorSpec(b + "attn_norm.weight", p + "input_layernorm.weight", (hp.n_embd,)),
            TensorSpec(b + "attn_qkv.weight", p + "self_attn.qkv_proj.weight", (qkv_rows, hp.n_embd)),
            TensorSpec(b + "attn_output.weight", p + "self_attn.o_proj.weight",
                       (hp.n_embd, hp.n_head * hp.head_dim)),
            TensorSpec(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (hp.n_embd,)),
            TensorSpec(b + "ffn_up.weight", p + "mlp.gate_up_proj.weight", (2 * hp.n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_down.weight", p + "mlp.down_proj.weight", (hp.n_embd, hp.n_ff)),
        ]
