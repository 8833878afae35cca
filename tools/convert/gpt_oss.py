"""gpt-oss (GGUF architecture "gpt-oss"): biased grouped-query attention with a learned sink per
head, sliding-window layers alternating with global ones (the first windowed), YaRN RoPE, and a
mixture of experts in every layer whose router and experts carry biases and whose experts apply
a clamped SwiGLU.

As llama.cpp's converter (conversion/gpt_oss.py) writes it: the attention's post-norm is
blk.N.post_attention_norm (gpt-oss's pre-MoE norm), the sinks blk.N.attn_sinks.weight, the
router ffn_gate_inp with its bias, transformers' fused, interleaved gate_up_proj [E, n_embd,
2 * n_ff] split into ffn_gate_exps (even columns) and ffn_up_exps (odd ones) with their biases,
down_proj into ffn_down_exps, the experts' weights in MXFP4 (the published checkpoints ship them
so; a float checkpoint's experts are quantized to it here, as gguf-py's MXFP4 quantizer would).
The sliding window is {arch}.attention.sliding_window; the layer pattern (llama.cpp's default of
2) is what transformers' layer_types must say. The SwiGLU constants are not in GGUF (llama.cpp
fixes 1.702 and 7.0), so other values are refused.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from .base import HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .qwen_moe import MoeFamily
from .registry import register

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
MXFP4_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@register("GptOssForCausalLM")
class GptOssFamily(MoeFamily):
    gguf_arch = "gpt-oss"
    qkv_bias = "required"

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        config = {**config, "moe_intermediate_size": config.get("intermediate_size")}
        super().__init__(hp, checkpoint, where, config)
        self.norm_topk_prob = True  # softmax over the top k: the renormalised top k of the softmax
        if (config.get("swiglu_alpha", SWIGLU_ALPHA), config.get("swiglu_limit", SWIGLU_LIMIT)) != (
                SWIGLU_ALPHA, SWIGLU_LIMIT):
            raise ConvertError(f"{where}: swiglu_alpha {config.get('swiglu_alpha')} and swiglu_limit "
                               f"{config.get('swiglu_limit')} differ from {SWIGLU_ALPHA} and "
                               f"{SWIGLU_LIMIT}, the values GGUF readers fix for gpt-oss")
        if config.get("attention_bias", True) is not True:
            raise ConvertError(f"{where}: attention_bias false; gpt-oss GGUF files have biases")
        if any(k in ("attention_factor", "mscale", "mscale_all_dim", "extrapolation_factor")
               for k in hp.rope_scaling):
            raise ConvertError(f"{where}: YaRN parameters {sorted(hp.rope_scaling)} beyond factor, "
                               "beta_fast, beta_slow and truncate are not supported")
        self.sliding_window = int(config.get("sliding_window") or 0)
        types = config.get("layer_types") or []
        expected = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(hp.n_layer)]
        if types and list(types) != expected:
            raise ConvertError(f"{where}: layer_types {types} is not sliding and full layers "
                               "alternating from a sliding one, the only layout gpt-oss GGUF says")
        self.mxfp4 = any(n.endswith("_blocks") for n in checkpoint.entries)
        if self.mxfp4:
            raise ConvertError(f"{where}: experts stored as MXFP4 blocks and scales (the published "
                               "checkpoints) are not read yet; convert a checkpoint with float "
                               "experts (transformers dequantizes them on load)")

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        e, n_ff = self.n_expert, self.n_ff_exp
        specs = [TensorSpec(b + "attn_norm.weight", p + "input_layernorm.weight", (hp.n_embd,))]
        for proj, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            specs.append(TensorSpec(f"{b}attn_{proj}.weight", f"{p}self_attn.{proj}_proj.weight",
                                    (rows, hp.n_embd)))
            specs.append(TensorSpec(f"{b}attn_{proj}.bias", f"{p}self_attn.{proj}_proj.bias", (rows,)))
        gate_up = p + "mlp.experts.gate_up_proj"
        specs += [
            TensorSpec(b + "attn_output.weight", p + "self_attn.o_proj.weight", (hp.n_embd, q_rows)),
            TensorSpec(b + "attn_output.bias", p + "self_attn.o_proj.bias", (hp.n_embd,)),
            TensorSpec(b + "attn_sinks.weight", p + "self_attn.sinks", (hp.n_head,)),
            TensorSpec(b + "post_attention_norm.weight", p + "post_attention_layernorm.weight",
                       (hp.n_embd,)),
            TensorSpec(b + "ffn_gate_inp.weight", p + "mlp.router.weight", (e, hp.n_embd)),
            TensorSpec(b + "ffn_gate_inp.bias", p + "mlp.router.bias", (e,)),
            # gate_up_proj is [E, n_embd, 2 n_ff] (x @ W), its columns gate, up, gate, up, ...
            TensorSpec(b + "ffn_gate_exps.weight", gate_up, (e, n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_gate_exps.bias", gate_up + "_bias", (e, n_ff)),
            TensorSpec(b + "ffn_up_exps.weight", gate_up, (e, n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_up_exps.bias", gate_up + "_bias", (e, n_ff)),
            TensorSpec(b + "ffn_down_exps.weight", p + "mlp.experts.down_proj", (e, hp.n_embd, n_ff)),
            TensorSpec(b + "ffn_down_exps.bias", p + "mlp.experts.down_proj_bias", (e, hp.n_embd)),
        ]
        return specs

    def tensor_specs(self) -> list[TensorSpec]:
        """As DecoderFamily's, with the checkpoint's shapes of the fused and transposed experts."""
        hp, ckpt = self.hp, self.checkpoint
        specs = self.all_specs()
        present = []
        for s in specs:
            entry = ckpt.entries.get(s.hf_name)
            if entry is None:
                if s.required:
                    raise ConvertError(f"{ckpt.folder}: tensor {s.hf_name} is missing (a "
                                       f"{self.gguf_arch} model with {hp.n_layer} layers needs it)")
                continue
            if entry.shape != self._checkpoint_shape(s):
                raise ConvertError(f"{entry.file}: tensor {s.hf_name} has shape "
                                   f"{list(entry.shape)}, config.json implies "
                                   f"{list(self._checkpoint_shape(s))}")
            present.append(s)
        used = {s.hf_name for s in present}
        extra = sorted(n for n in ckpt.entries if n not in used and not self.ignored(n))
        if extra:
            raise ConvertError(f"{ckpt.folder}: tensor {extra[0]} has no place in a "
                               f"{self.gguf_arch} GGUF file ({len(extra)} such tensors)")
        return present

    def _checkpoint_shape(self, s: TensorSpec) -> tuple[int, ...]:
        e, n_ff, n_embd = self.n_expert, self.n_ff_exp, self.hp.n_embd
        if s.hf_name.endswith("gate_up_proj"):
            return (e, n_embd, 2 * n_ff)
        if s.hf_name.endswith("gate_up_proj_bias"):
            return (e, 2 * n_ff)
        if s.hf_name.endswith("down_proj"):
            return (e, n_ff, n_embd)
        return s.shape

    def load(self, spec: TensorSpec) -> np.ndarray:
        values = self.checkpoint.read_f32(spec.hf_name)
        name = spec.gguf_name
        if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            start = 0 if "gate" in name else 1
            return np.ascontiguousarray(values[:, :, start::2].transpose(0, 2, 1))
        if name.endswith(("ffn_gate_exps.bias", "ffn_up_exps.bias")):
            return np.ascontiguousarray(values[:, (0 if "gate" in name else 1)::2])
        if name.endswith("ffn_down_exps.weight"):
            return np.ascontiguousarray(values.transpose(0, 2, 1))
        return values

    def planned_type(self, name: str, default: GGMLQuantizationType) -> GGMLQuantizationType:
        """The experts' weights are MXFP4 whatever the output type (as the published files)."""
        return GGMLQuantizationType.MXFP4 if name.endswith(MXFP4_TENSORS) else default

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        arch = self.gguf_arch
        if self.sliding_window > 0:
            w.add_uint32(f"{arch}.attention.sliding_window", self.sliding_window)
        scaling = self.hp.rope_scaling
        if scaling.get("rope_type") == "yarn":
            for key in ("beta_fast", "beta_slow"):
                if scaling.get(key) is not None:
                    w.add_float32(f"{arch}.rope.scaling.yarn_{key}", float(scaling[key]))
            if scaling.get("truncate", True) is False:
                w.add_bool(f"{arch}.rope.scaling.yarn_truncate", False)
