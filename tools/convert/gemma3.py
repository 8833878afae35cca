"""Gemma 3 text models (GGUF architecture "gemma3"): sandwich norms around attention and the
feed-forward, per-head Q/K norms, GeGLU, and sliding-window layers between global ones.

As llama.cpp's converter writes it: every RMSNorm weight w becomes 1 + w (Gemma's norms scale by
1 + w; GGUF's by w); the local layers' RoPE base is rope.freq_base_swa, the global layers' is
rope.freq_base; the layer pattern is attention.sliding_window_pattern (every n-th layer global).
The query scale GGUF does not store (ember and llama.cpp derive it from head_dim), so a config
whose query_pre_attn_scalar says otherwise is refused rather than converted wrong.
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


@register("Gemma3ForCausalLM")
class Gemma3Family(DecoderFamily):
    gguf_arch = "gemma3"
    qk_norm = True
    activations = ("gelu_pytorch_tanh",)
    rope_scaling_types = ("linear",)

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        rope = config.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        self.rope_base = float(full.get("rope_theta", config.get("rope_theta", 1000000.0)))
        self.rope_base_local = float(local.get("rope_theta",
                                               config.get("rope_local_base_freq", DEFAULT_LOCAL_BASE)))
        scaling = dict(config.get("rope_scaling") or full)
        if scaling.get("rope_type", "default") in ("default", None):
            scaling = {}
        super().__init__(replace(hp, rope_theta=self.rope_base, rope_scaling=scaling), checkpoint,
                         where, config)
        self.sliding_window = int(config.get("sliding_window") or 0)
        self.pattern = _layer_pattern(config, self.hp.n_layer, where)
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if config.get(key) is not None:
                raise ConvertError(f"{where}: {key} {config[key]} is not supported for gemma3")
        scalar = config.get("query_pre_attn_scalar", self.hp.head_dim)
        expected = (self.hp.n_embd // self.hp.n_head if self.hp.n_layer == 62 else self.hp.head_dim)
        if scalar != expected:
            raise ConvertError(f"{where}: query_pre_attn_scalar {scalar} differs from {expected}, "
                               "the value GGUF readers derive for this shape")

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        norm = (hp.n_embd,)
        return [
            TensorSpec(b + "attn_norm.weight", p + "input_layernorm.weight", norm),
            TensorSpec(b + "attn_q.weight", p + "self_attn.q_proj.weight", (q_rows, hp.n_embd)),
            TensorSpec(b + "attn_k.weight", p + "self_attn.k_proj.weight", (kv_rows, hp.n_embd)),
            TensorSpec(b + "attn_v.weight", p + "self_attn.v_proj.weight", (kv_rows, hp.n_embd)),
            TensorSpec(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", (hp.head_dim,)),
            TensorSpec(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", (hp.head_dim,)),
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
        if self.sliding_window > 0:
            w.add_uint32(f"{self.gguf_arch}.attention.sliding_window", self.sliding_window)
            w.add_uint32(f"{self.gguf_arch}.attention.sliding_window_pattern", self.pattern)
            w.add_float32(f"{self.gguf_arch}.rope.freq_base_swa", self.rope_base_local)


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
