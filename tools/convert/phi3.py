"""Phi-3 (GGUF architecture "phi3"): Llama's block with Q, K and V fused into one projection
(attn_qkv) and the feed-forward's gate and up fused into one (ffn_up, gate rows first), as
llama.cpp's converter writes them; RoPE in the NeoX layout, partial when partial_rotary_factor
says so. LongRoPE (the 128k-context models) is refused: ember does not run it yet."""

from __future__ import annotations

from .base import DecoderFamily, HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .registry import register


@register("Phi3ForCausalLM")
class Phi3Family(DecoderFamily):
    gguf_arch = "phi3"
    rope_scaling_types = ("linear",)

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        if (config.get("rope_scaling") or {}).get("type") == "longrope" or \
                hp.rope_scaling.get("rope_type") == "longrope":
            raise ConvertError(f"{where}: LongRoPE scaling is not supported yet (ember runs "
                               "Phi-3 models without rope_scaling, such as the 4k-context ones)")
        super().__init__(hp, checkpoint, where, config)
        factor = float(config.get("partial_rotary_factor") or 1.0)
        self._n_rot = int(hp.head_dim * factor)
        if self._n_rot <= 0 or self._n_rot % 2 or self._n_rot > hp.head_dim:
            raise ConvertError(f"{where}: partial_rotary_factor {factor} gives {self._n_rot} rotated "
                               f"dimensions of {hp.head_dim}; expected an even count")

    @property
    def n_rot(self) -> int:
        return self._n_rot

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
