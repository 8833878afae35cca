"""What the Llama-shaped decoder families share: config.json to hyper-parameters, the HF -> GGUF
tensor names and the shapes config.json implies, and the {arch}.* metadata keys.

A family module (llama.py, qwen2.py, qwen3.py, gemma3.py) subclasses DecoderFamily, sets its GGUF
architecture and the few ways it differs (Q/K permutation, biases, Q/K norms, RoPE scaling), and
registers itself by Hugging Face class name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, PoolingType, RopeScalingType

from .checkpoint import Checkpoint
from .errors import ConvertError

# Tensors some checkpoints carry that the GGUF file does not need.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class HParams:
    """config.json, reduced to what the GGUF file records."""

    model_type: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int | None
    rms_eps: float
    rope_theta: float | None
    rope_scaling: dict          # {} when none; else has "rope_type" and its parameters
    tie_embeddings: bool | None  # None when config.json does not say

    @classmethod
    def from_config(cls, config: dict, where: str) -> HParams:
        def need(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or value <= 0:
                raise ConvertError(f"{where}: {key} is {value!r}, expected a positive integer")
            return value

        n_embd, n_head = need("hidden_size"), need("num_attention_heads")
        n_head_kv = config.get("num_key_value_heads") or n_head
        head_dim = config.get("head_dim") or n_embd // n_head
        if n_head % n_head_kv != 0:
            raise ConvertError(f"{where}: num_attention_heads {n_head} is not a multiple of "
                               f"num_key_value_heads {n_head_kv}")
        rope_parameters = config.get("rope_parameters") or {}
        scaling = dict(config.get("rope_scaling") or rope_parameters)
        scaling_type = scaling.get("rope_type", scaling.get("type"))
        if scaling_type in (None, "default", "none"):
            scaling = {}
        else:
            scaling["rope_type"] = scaling_type
        theta = config.get("rope_theta", rope_parameters.get("rope_theta"))
        return cls(
            model_type=str(config.get("model_type", "")),
            n_vocab=need("vocab_size"),
            n_embd=n_embd,
            n_layer=need("num_hidden_layers"),
            n_ff=need("intermediate_size"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ctx=config.get("max_position_embeddings"),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta) if theta is not None else None,
            rope_scaling=scaling,
            tie_embeddings=config.get("tie_word_embeddings"),
        )


@dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor taken from one checkpoint tensor."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]   # expected, PyTorch order ([out, in]); numpy order for the writer too
    required: bool = True
    # Non-empty: the GGUF tensor stacks these checkpoint tensors (one per expert, each of shape
    # shape[1:]) along a new first axis, and hf_name only names the whole for messages.
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExtraTensor:
    """A GGUF tensor computed from the config rather than read (llama3's rope_freqs)."""

    gguf_name: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


class DecoderFamily:
    """A decoder-only transformer laid out like Llama in both HF and GGUF naming."""

    gguf_arch: ClassVar[str]
    permute_qk: ClassVar[bool] = False      # llama: HF rotate-half rows -> GGUF interleaved pairs
    qkv_bias: ClassVar[str] = "none"        # "none", "optional" or "required"
    qk_norm: ClassVar[bool] = False         # per-head RMS norm on Q and K (qwen3)
    rope_scaling_types: ClassVar[tuple[str, ...]] = ("linear", "yarn")
    rope_scaling_without_factor: ClassVar[tuple[str, ...]] = ()  # types whose parameters are others

    # The feed-forward's activation the forward pass computes (config.json's hidden_act, or
    # hidden_activation); SwiGLU's silu for the Llama-shaped families.
    activations: ClassVar[tuple[str, ...]] = ("silu", "swish")

    @staticmethod
    def text_config(config: dict) -> dict:
        """config.json's text model part (a multimodal checkpoint nests it): what HParams reads."""
        return config

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        self.hp = hp
        self.checkpoint = checkpoint
        act = config.get("hidden_activation") or config.get("hidden_act") or self.activations[0]
        if act not in self.activations:
            raise ConvertError(f"{where}: activation {act!r} is not supported for "
                               f"{self.gguf_arch} (supported: {', '.join(self.activations)})")
        scaling = hp.rope_scaling.get("rope_type")
        if scaling is not None and scaling not in self.rope_scaling_types:
            raise ConvertError(f"{where}: RoPE scaling {scaling!r} is not supported for "
                               f"{self.gguf_arch} (supported: "
                               f"{', '.join(self.rope_scaling_types)})")
        if (scaling is not None and scaling not in self.rope_scaling_without_factor and
                "factor" not in hp.rope_scaling):
            raise ConvertError(f"{where}: RoPE scaling {scaling!r} without a factor")
        # A *ForSequenceClassification (a reranker): its head score.weight over the last token's
        # state, no LM head; written as llama.cpp's cls.output with pooling rank and its labels.
        self.labels: list[str] = []
        if "score.weight" in checkpoint:
            n_labels = checkpoint.entries["score.weight"].shape[0]
            id2label = config.get("id2label") or {}
            self.labels = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(n_labels)]

    # --- tensors -------------------------------------------------------------------------

    def layer_specs(self, i: int) -> list[TensorSpec]:
        hp = self.hp
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q_rows, kv_rows = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        specs = [TensorSpec(b + "attn_norm.weight", p + "input_layernorm.weight", (hp.n_embd,))]
        for proj, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            specs.append(TensorSpec(f"{b}attn_{proj}.weight", f"{p}self_attn.{proj}_proj.weight",
                                    (rows, hp.n_embd)))
            if self.qkv_bias != "none":
                specs.append(TensorSpec(f"{b}attn_{proj}.bias", f"{p}self_attn.{proj}_proj.bias",
                                        (rows,), required=self.qkv_bias == "required"))
        if self.qk_norm:
            specs.append(TensorSpec(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight",
                                    (hp.head_dim,)))
            specs.append(TensorSpec(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight",
                                    (hp.head_dim,)))
        specs.append(TensorSpec(b + "attn_output.weight", p + "self_attn.o_proj.weight",
                                (hp.n_embd, q_rows)))
        if self.qkv_bias == "optional":
            specs.append(TensorSpec(b + "attn_output.bias", p + "self_attn.o_proj.bias",
                                    (hp.n_embd,), required=False))
        specs += [
            TensorSpec(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (hp.n_embd,)),
            TensorSpec(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (hp.n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_up.weight", p + "mlp.up_proj.weight", (hp.n_ff, hp.n_embd)),
            TensorSpec(b + "ffn_down.weight", p + "mlp.down_proj.weight", (hp.n_embd, hp.n_ff)),
        ]
        return specs

    def all_specs(self) -> list[TensorSpec]:
        """Every GGUF tensor of the family, in GGUF order (optional ones included)."""
        hp, ckpt = self.hp, self.checkpoint
        specs = [TensorSpec("token_embd.weight", "model.embed_tokens.weight",
                            (hp.n_vocab, hp.n_embd))]
        for i in range(hp.n_layer):
            specs += self.layer_specs(i)
        specs.append(TensorSpec("output_norm.weight", "model.norm.weight", (hp.n_embd,)))
        specs.append(TensorSpec("output.weight", "lm_head.weight", (hp.n_vocab, hp.n_embd),
                                required=False))
        if self.labels:
            specs.append(TensorSpec("cls.output.weight", "score.weight",
                                    (len(self.labels), hp.n_embd)))
        elif "lm_head.weight" not in ckpt and hp.tie_embeddings is False:
            raise ConvertError(f"{ckpt.folder}: no lm_head.weight, but config.json says "
                               f"tie_word_embeddings is false")
        return specs

    def ignored(self, hf_name: str) -> bool:
        """Checkpoint tensors the GGUF file does not need."""
        return hf_name.endswith(IGNORED_SUFFIXES)

    def tensor_specs(self) -> list[TensorSpec]:
        """Every checkpoint tensor the GGUF file takes, in GGUF order, checked against the
        checkpoint: required ones present, shapes as config.json implies, nothing left over."""
        hp, ckpt = self.hp, self.checkpoint
        specs = self.all_specs()
        present = []
        for s in specs:
            if s.parts:
                self._check_parts(s)
                present.append(s)
                continue
            entry = ckpt.entries.get(s.hf_name)
            if entry is None:
                if s.required:
                    raise ConvertError(f"{ckpt.folder}: tensor {s.hf_name} is missing (a "
                                       f"{self.gguf_arch} model with {hp.n_layer} layers needs it)")
                continue
            if entry.shape != s.shape:
                raise ConvertError(f"{entry.file}: tensor {s.hf_name} has shape "
                                   f"{list(entry.shape)}, config.json implies {list(s.shape)}")
            present.append(s)
        used = {name for s in present for name in (s.parts or (s.hf_name,))}
        extra = sorted(n for n in ckpt.entries
                       if n not in used and not self.ignored(n))
        if extra:
            raise ConvertError(f"{ckpt.folder}: tensor {extra[0]} has no place in a "
                               f"{self.gguf_arch} GGUF file ({len(extra)} such tensors); is "
                               f"config.json's architecture right?")
        return present

    def _check_parts(self, spec: TensorSpec) -> None:
        for name in spec.parts:
            entry = self.checkpoint.entries.get(name)
            if entry is None:
                raise ConvertError(f"{self.checkpoint.folder}: tensor {name} is missing (part of "
                                   f"{spec.gguf_name}, {len(spec.parts)} tensors)")
            if entry.shape != spec.shape[1:]:
                raise ConvertError(f"{entry.file}: tensor {name} has shape {list(entry.shape)}, "
                                   f"config.json implies {list(spec.shape[1:])}")

    def load(self, spec: TensorSpec) -> np.ndarray:
        """The GGUF values of `spec`: its checkpoint tensor (or its parts stacked), transformed."""
        read = self.checkpoint.read_f32
        values = np.stack([read(n) for n in spec.parts]) if spec.parts else read(spec.hf_name)
        return self.transform(spec, values)

    def transform(self, spec: TensorSpec, values: np.ndarray) -> np.ndarray:
        """Checkpoint values -> GGUF values (same shape): the Q/K row permutation for llama."""
        if self.permute_qk:
            if spec.gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
                return permute(values, self.hp.n_head)
            if spec.gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
                return permute(values, self.hp.n_head_kv)
        return values

    def extra_tensors(self) -> list[ExtraTensor]:
        return []

    def planned_type(self, name: str, default: GGMLQuantizationType) -> GGMLQuantizationType:
        """The type tensor `name` is written as, given the output type's rules' `default`."""
        return default

    @property
    def n_rot(self) -> int:
        """Rotated dimensions of each head (all of them unless a family says otherwise)."""
        return self.hp.head_dim

    # --- metadata ------------------------------------------------------------------------

    def add_shape(self, w: GGUFWriter) -> None:
        """The keys every transformer's file has: context, widths, layers, heads."""
        hp = self.hp
        if hp.n_ctx is not None:
            w.add_context_length(hp.n_ctx)
        w.add_embedding_length(hp.n_embd)
        w.add_block_count(hp.n_layer)
        w.add_feed_forward_length(hp.n_ff)
        w.add_head_count(hp.n_head)

    def add_metadata(self, w: GGUFWriter) -> None:
        self.add_shape(w)
        hp = self.hp
        w.add_head_count_kv(hp.n_head_kv)
        if hp.rope_theta is not None:
            w.add_rope_freq_base(hp.rope_theta)
        w.add_layer_norm_rms_eps(hp.rms_eps)
        if hp.head_dim != hp.n_embd // hp.n_head:
            w.add_key_length(hp.head_dim)
            w.add_value_length(hp.head_dim)
        w.add_rope_dimension_count(self.n_rot)
        w.add_vocab_size(hp.n_vocab)
        # A sentence-transformers decoder (Qwen3-Embedding, gte-Qwen2: last token) says how it
        # pools; a chat model's file says nothing (ember and llama.cpp then pool none).
        pooling = PoolingType.RANK if self.labels else sentence_pooling(self.checkpoint)
        if pooling is not None:
            w.add_pooling_type(pooling)
        if self.labels:
            w.add_classifier_output_labels(self.labels)
        scaling = hp.rope_scaling
        if scaling.get("rope_type") == "linear":
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
        elif scaling.get("rope_type") == "yarn":
            w.add_rope_scaling_type(RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(scaling["factor"]))
            original = scaling.get("original_max_position_embeddings")
            if original is not None:
                w.add_rope_scaling_orig_ctx_len(int(original))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: within each head, HF's rotate-half row order
    (all first halves, then all second halves) becomes the interleaved pairs (x0, x_half, x1, ...)
    that llama.cpp's "normal" RoPE rotates."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def sentence_pooling(checkpoint: Checkpoint) -> PoolingType | None:
    """The sentence-transformers Pooling module's mode (modules.json -> its config.json, as
    convert_hf_to_gguf's _try_set_pooling_type reads it); None when the folder has none."""
    folder = checkpoint.folder
    modules = folder / "modules.json"
    if not modules.is_file():
        return None
    try:
        entries = json.loads(modules.read_text("utf-8"))
        path = next((m["path"] for m in entries if m["type"].endswith("Pooling")), None)
        if path is None:
            return None
        pooling = json.loads((folder / path / "config.json").read_text("utf-8"))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ConvertError(f"{modules}: cannot read the Pooling module's config ({err})") from None
    if pooling.get("pooling_mode_mean_tokens"):
        return PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return PoolingType.CLS
    if pooling.get("pooling_mode_lasttoken"):
        return PoolingType.LAST
    raise ConvertError(f"{folder / path / 'config.json'}: pooling mode {pooling} is not "
                       "supported (mean, cls or lasttoken)")
