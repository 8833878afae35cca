"""Qwen2-MoE and Qwen3-MoE (GGUF architectures "qwen2moe", "qwen3moe"): Qwen2's (biases) or
Qwen3's (Q/K norms) attention with a mixture-of-experts feed-forward in every layer.

As llama.cpp's converter writes them: the router is ffn_gate_inp (kept f32); the experts'
gate_proj / up_proj / down_proj are stacked into the 3-D tensors ffn_{gate,up,down}_exps
({n_in, n_out, n_expert} in ggml order); Qwen2-MoE's shared expert is ffn_{gate,up,down}_shexp
with its sigmoid gate ffn_gate_inp_shexp (f32); metadata expert_count, expert_used_count,
expert_feed_forward_length and expert_shared_feed_forward_length.

The top-k weights are renormalised when config.json's norm_topk_prob says so (transformers'
default: not). GGUF records that as {arch}.expert_weights_norm, which ember reads; llama.cpp
ignores the key and fixes it per architecture (qwen2moe: not renormalised, qwen3moe:
renormalised), which is what the published Qwen MoE checkpoints use.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import GGUFWriter

from .base import DecoderFamily, HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register


class MoeFamily(DecoderFamily):
    """A Qwen decoder whose every feed-forward is routed over experts."""

    shared_expert: ClassVar[bool] = False

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)

        def need(*keys: str) -> int:
            value = next((config[k] for k in keys if config.get(k) is not None), None)
            if not isinstance(value, int) or value <= 0:
                raise ConvertError(f"{where}: {keys[0]} is {value!r}, expected a positive integer")
            return value

        self.n_expert = need("num_experts", "num_local_experts")
        self.n_expert_used = need("num_experts_per_tok")
        self.n_ff_exp = need("moe_intermediate_size")
        self.n_ff_shexp = need("shared_expert_intermediate_size") if self.shared_expert else 0
        if self.n_expert_used > self.n_expert:
            raise ConvertError(f"{where}: num_experts_per_tok {self.n_expert_used} exceeds the "
                               f"{self.n_expert} experts")
        dense = list(config.get("mlp_only_layers") or [])
        if config.get("decoder_sparse_step", 1) != 1 or dense:
            raise ConvertError(f"{where}: dense layers between the expert layers (decoder_sparse_step "
                               f"{config.get('decoder_sparse_step', 1)}, mlp_only_layers {dense}) are "
                               f"not supported; GGUF {self.gguf_arch} has experts in every layer")
        self.norm_topk_prob = bool(config.get("norm_topk_prob", False))

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.mlp.", f"blk.{i}."
        dense = super().layer_specs(i)
        specs = [s for s in dense if not s.gguf_name.startswith(b + "ffn_") or
                 s.gguf_name == b + "ffn_norm.weight"]
        specs.append(TensorSpec(b + "ffn_gate_inp.weight", p + "gate.weight", (self.n_expert, hp.n_embd)))
        shapes = {"gate": (self.n_ff_exp, hp.n_embd), "up": (self.n_ff_exp, hp.n_embd),
                  "down": (hp.n_embd, self.n_ff_exp)}
        for proj, shape in shapes.items():
            parts = tuple(f"{p}experts.{e}.{proj}_proj.weight" for e in range(self.n_expert))
            specs.append(TensorSpec(f"{b}ffn_{proj}_exps.weight", f"{p}experts.*.{proj}_proj.weight",
                                    (self.n_expert, *shape), parts=parts))
        if self.shared_expert:
            n_ff = self.n_ff_shexp
            specs += [
                TensorSpec(b + "ffn_gate_inp_shexp.weight", p + "shared_expert_gate.weight",
                           (1, hp.n_embd)),
                TensorSpec(b + "ffn_gate_shexp.weight", p + "shared_expert.gate_proj.weight",
                           (n_ff, hp.n_embd)),
                TensorSpec(b + "ffn_up_shexp.weight", p + "shared_expert.up_proj.weight",
                           (n_ff, hp.n_embd)),
                TensorSpec(b + "ffn_down_shexp.weight", p + "shared_expert.down_proj.weight",
                           (hp.n_embd, n_ff)),
            ]
        return specs

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        w.add_expert_count(self.n_expert)
        w.add_expert_used_count(self.n_expert_used)
        w.add_expert_feed_forward_length(self.n_ff_exp)
        if self.shared_expert:
            w.add_expert_shared_feed_forward_length(self.n_ff_shexp)
        w.add_expert_weights_norm(self.norm_topk_prob)


@register("Qwen2MoeForCausalLM")
class Qwen2MoeFamily(MoeFamily):
    gguf_arch = "qwen2moe"
    qkv_bias = "required"
    shared_expert = True


@register("Qwen3MoeForCausalLM")
class Qwen3MoeFamily(MoeFamily):
    gguf_arch = "qwen3moe"
    qk_norm = True
