"""Gemma 3 and Gemma 2 text models (GGUF architectures "gemma3", "gemma2"): sandwich norms around
attention and the feed-forward, GeGLU, and sliding-window layers between global ones; Gemma 3 adds
per-head Q/K norms, Gemma 2 soft-caps the attention scores and the logits.

As llama.cpp's converter writes them: every RMSNorm weight w becomes 1 + w (Gemma's norms scale
by 1 + w; GGUF's by w); Gemma 3's local layers' RoPE base is rope.freq_base_swa, the global
layers' rope.freq_base (Gemma 2's layers share one base); the layer pattern is
attention.sliding_window_pattern (every n-th layer global); the caps are
{arch}.attn_logit_softcapping and {arch}.final_logit_softcapping. The query scale GGUF does not
store (ember and llama.cpp derive it from head_dim), so a config whose query_pre_attn_scalar says
otherwise is refused rather than converted wrong.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from gguf import GGUFWriter

from .base import DecoderFamily, HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register

DEFAULT_LOCAL_BASE = 10000.0


class GemmaFamily(DecoderFamily):
    """What Gemma 2 and 3 share; a subclass sets gguf_arch, qk_norm and the 27B layer count."""

    activations = ("gelu_pytorch_tanh",)
    n_layer_27b: int  # the 27B model's layers: its query scale is n_embd / n_head, not head_dim

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)
        self.sliding_window = int(config.get("sliding_window") or 0)
        self.pattern = _layer_pattern(config, self.hp.n_layer, where)
        self.rope_base_local: float | None = None  # None: the global base
        self.softcaps = {key: float(config[key]) for key in
                         ("attn_logit_softcapping", "final_logit_softcapping")
                         if config.get(key) is not None}
        if any(cap <= 0 for cap in self.softcaps.values()):
            raise ConvertError(f"{where}: soft-capping {self.softcaps} must be > 0")
        scalar = config.get("query_pre_attn_scalar", self.hp.head_dim)
        expected = (self.hp.n_embd // self.hp.n_head if self.hp.n_layer == self.n_layer_27b
                    else self.hp.head_dim)
        if scalar != expected:
            raise ConvertError(f"{where}: query_pre_attn_scalar {scalar} differs from {expected}, "
                               "the value GGUF readers derive for this shape")

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        norm = (hp.n_embd,)
        qk_norms = [
            TensorSpec(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", (hp.head_dim,)),
            TensorSpec(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", (hp.head_dim,)),
        ] if self.qk_norm else []
        return [
            TensorSpec(b + "attn_norm.weight", p + "input_layernorm.weight", norm),
            TensorSpec(b + "attn_q.weight", p + "self_attn.q_proj.weight", (q_rows, hp.n_embd)),
            TensorSpec(b + "attn_k.weight", p + "self_attn.k_proj.weight", (kv_rows, hp.n_embd)),
            TensorSpec(b + "attn_v.weight", p + "self_attn.v_proj.weight", (kv_rows, hp.n_embd)),
            *qk_norms,
            TensorSpec(b + "attn_output.weight", p + "self_attn.o_proj.weight", (hp.n_embd, q_rows)),
            TensorSpec(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight", norm),
            TensorSpec(b + "ffn_norm.weight", p + "pre_feedforward_layernorm.weight", norm),
            TensorSpec(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (hp.n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_up.weight", p + "mlp.up_proj.weight", (hp.n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_down.weight", p + "mlp.down_proj.weight", (hp.n_embd, hp.n_ff)),
            TensorSpec(b + "post_ffw_norm.weight", p + "post_feedforward_layernorm.weight", norm),
        ]

    def transform(self, spec: TensorSpec, values: np.ndarray) -> np.ndarray:
        if spec.gguf_name.endswith("norm.weight"):
            return values + np.float32(1.0)
        return values

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        arch = self.gguf_arch
        if self.sliding_window > 0:
            w.add_uint32(f"{arch}.attention.sliding_window", self.sliding_window)
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", self.pattern)
            if self.rope_base_local is not None:
                w.add_float32(f"{arch}.rope.freq_base_swa", self.rope_base_local)
        for key, cap in self.softcaps.items():
            w.add_float32(f"{arch}.{key}", cap)


@register("Gemma3ForCausalLM")
class Gemma3Family(GemmaFamily):
    gguf_arch = "gemma3"
    qk_norm = True
    rope_scaling_types = ("linear",)
    n_layer_27b = 62

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        rope = config.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        rope_base = float(full.get("rope_theta", config.get("rope_theta", 1000000.0)))
        scaling = dict(config.get("rope_scaling") or full)
        if scaling.get("rope_type", "default") in ("default", None):
            scaling = {}
        super().__init__(replace(hp, rope_theta=rope_base, rope_scaling=scaling), checkpoint,
                         where, config)
        self.rope_base_local = float(local.get("rope_theta",
                                               config.get("rope_local_base_freq", DEFAULT_LOCAL_BASE)))


@register("Gemma2ForCausalLM")
class Gemma2Family(GemmaFamily):
    gguf_arch = "gemma2"
    rope_scaling_types = ()
    n_layer_27b = 46


def _layer_pattern(config: dict, n_layer: int, where: str) -> int:
    """n such that every n-th layer is global and the others sliding, from layer_types (or the
    older sliding_window_pattern); a layout of another shape is refused."""
    types = config.get("layer_types")
    if not types:
        return int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
    global_layers = [i for i, t in enumerate(types) if t == "full_attention"]
    n = global_layers[0] + 1 if global_layers else n_layer + 1
    expected = ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(n_layer)]
    if list(types) != expected:
        raise ConvertError(f"{where}: layer_types {types} is not every {n}-th layer global, the only "
                           "layout GGUF's sliding_window_pattern can say")
    return n
