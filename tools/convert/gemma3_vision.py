"""Gemma 3 with vision (Gemma3ForConditionalGeneration): its language model converts as Gemma 3
text does (gemma3.py), from config.json's text_config and the language_model.* tensors; its
SigLIP vision tower and multimodal projector go to a second file, the mmproj, in llama.cpp's
clip layout (what convert_hf_to_gguf.py --mmproj writes and llama-server --mmproj reads):

- keys: general.architecture "clip", clip.projector_type "gemma3", clip.has_vision_encoder,
  clip.vision.{image_size, patch_size, embedding_length, feed_forward_length, block_count,
  attention.head_count, attention.layer_norm_epsilon, projection_dim (the text width),
  image_mean, image_std}, clip.use_gelu, and clip.vision.projector.scale_factor (patches per
  side pooled into one token) when it is not Gemma 3's 4;
- tensors: v.patch_embd.{weight,bias}, v.position_embd.weight, v.blk.N.{ln1, attn_q, attn_k,
  attn_v, attn_out, ln2, ffn_up (fc1), ffn_down (fc2)}.{weight,bias}, v.post_ln.{weight,bias},
  mm.input_projection.weight (as transformers stores it, [vision, text]: always f16, as llama.cpp
  forces it) and mm.soft_emb_norm.weight (1 + w: Gemma's RMSNorm scale). Matrices are f16 (f32
  for an f32 output); the embeddings (patch and position) and vectors f32, as llama.cpp's.

Checkpoints name their parts in three ways (transformers 4.5x: language_model.model.*,
vision_tower.vision_model.*; transformers 5: model.language_model.*, model.vision_tower.*; or
vision_tower.* without vision_model); all three are read.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from .base import HParams, TensorSpec
from .checkpoint import Checkpoint
from .errors import ConvertError
from .gemma3 import Gemma3Family
from .registry import register
from .writer import TensorPlan, write_gguf

# transformers' Gemma3TextConfig / SiglipVisionConfig defaults, for keys a config.json leaves out
# (published Gemma 3 configs list only what differs from them).
TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
                 "sliding_window": 4096, "max_position_embeddings": 131072,
                 "hidden_activation": "gelu_pytorch_tanh"}
VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                   "num_attention_heads": 16, "image_size": 896, "patch_size": 14,
                   "layer_norm_eps": 1e-6}
DEFAULT_MM_TOKENS = 256
DEFAULT_SCALE_FACTOR = 4  # llama.cpp's default pooling for gemma3 (the key is written otherwise)

TEXT_PREFIXES = ("language_model.model.", "model.language_model.")
VISION_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.",
                   "model.vision_tower.", "vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
# SigLIP's attention-pooling head: Gemma 3 never runs it (llama.cpp drops it too).
UNUSED_VISION = ("head.",)


@register("Gemma3ForConditionalGeneration")
class Gemma3VisionFamily(Gemma3Family):
    """The text half; `mmproj` writes the vision half."""

    # convert() calls a family's mmproj(folder, config, out, out_type, ...) when it has one:
    # f32 matrices for an f32 file, f16 otherwise.
    mmproj = staticmethod(lambda folder, config, out, out_type, **kwargs: write_mmproj(
        folder, config, out, GGMLQuantizationType.F32 if out_type.base == GGMLQuantizationType.F32
        else GGMLQuantizationType.F16, **kwargs))

    @staticmethod
    def text_config(config: dict) -> dict:
        text = {**TEXT_DEFAULTS, **(config.get("text_config") or {})}
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
        return text

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        names = checkpoint.entries
        self.text_prefix = next((p for p in TEXT_PREFIXES
                                 if any(n.startswith(p) for n in names)), None)
        if self.text_prefix is None:
            raise ConvertError(f"{checkpoint.folder}: no language model tensors (expected names "
                               f"starting {' or '.join(TEXT_PREFIXES)})")
        self.lm_head = next((n for n in ("lm_head.weight", "language_model.lm_head.weight")
                             if n in names), "lm_head.weight")
        super().__init__(hp, checkpoint, where, config)

    def all_specs(self) -> list[TensorSpec]:
        def rename(spec: TensorSpec) -> TensorSpec:
            if spec.hf_name == "lm_head.weight":
                return replace(spec, hf_name=self.lm_head)
            return replace(spec, hf_name=self.text_prefix + spec.hf_name.removeprefix("model."))
        return [rename(s) for s in super().all_specs()]

    def ignored(self, hf_name: str) -> bool:
        return (super().ignored(hf_name) or hf_name.startswith(VISION_PREFIXES) or
                hf_name.startswith(PROJECTOR_PREFIXES))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConvertError(f"{path}: cannot read it as JSON ({err})") from None


def write_mmproj(folder: Path, config: dict, out: Path, matrix_type: GGMLQuantizationType, *,
                 force: bool = False, progress: bool | None = None, name: str = "") -> int:
    """Writes the vision tower and projector of the Gemma 3 checkpoint in `folder` to the mmproj
    `out`; returns its tensor count."""
    where = str(folder / "config.json")
    vision = {**VISION_DEFAULTS, **(config.get("vision_config") or {})}
    n_text = int(Gemma3VisionFamily.text_config(config)["hidden_size"])
    d, n_ff = int(vision["hidden_size"]), int(vision["intermediate_size"])
    n_layer, n_head = int(vision["num_hidden_layers"]), int(vision["num_attention_heads"])
    image_size, patch = int(vision["image_size"]), int(vision["patch_size"])
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConvertError(f"{where}: vision_config hidden_act {act!r} is not supported "
                           "(gelu_pytorch_tanh)")
    if image_size % patch:
        raise ConvertError(f"{where}: image_size {image_size} is not a multiple of patch_size "
                           f"{patch}")
    n_side = image_size // patch
    mm_tokens = int(config.get("mm_tokens_per_image", DEFAULT_MM_TOKENS))
    tokens_side = math.isqrt(mm_tokens)
    if tokens_side * tokens_side != mm_tokens or tokens_side == 0 or n_side % tokens_side:
        raise ConvertError(f"{where}: mm_tokens_per_image {mm_tokens} is not a square that "
                           f"divides the {n_side}x{n_side} patches")
    scale_factor = n_side // tokens_side
    pre = _read_json(folder / "preprocessor_config.json")
    mean = [float(x) for x in pre.get("image_mean", [0.5, 0.5, 0.5])]
    std = [float(x) for x in pre.get("image_std", [0.5, 0.5, 0.5])]

    checkpoint = Checkpoint(folder)
    names = checkpoint.entries
    vprefix = next((p for p in VISION_PREFIXES if f"{p}embeddings.patch_embedding.weight" in names),
                   None)
    pprefix = next((p for p in PROJECTOR_PREFIXES
                    if f"{p}mm_input_projection_weight" in names), None)
    if vprefix is None or pprefix is None:
        raise ConvertError(f"{folder}: no vision tower or projector tensors "
                           "(vision_tower.*embeddings.patch_embedding.weight, "
                           "multi_modal_projector.mm_input_projection_weight)")

    # (gguf name, hf name, expected shape, type, transform)
    specs: list[tuple[str, str, tuple[int, ...], GGMLQuantizationType, object]] = []
    f32 = GGMLQuantizationType.F32

    def add(gguf_name: str, hf_name: str, shape: tuple[int, ...], qtype=None, fn=None) -> None:
        if qtype is None:
            qtype = matrix_type if len(shape) > 1 else f32
        specs.append((gguf_name, hf_name, shape, qtype, fn))

    e = f"{vprefix}embeddings."
    add("v.patch_embd.weight", e + "patch_embedding.weight", (d, 3, patch, patch), f32)
    add("v.patch_embd.bias", e + "patch_embedding.bias", (d,))
    add("v.position_embd.weight", e + "position_embedding.weight", (n_side * n_side, d), f32)
    for i in range(n_layer):
        p, b = f"{vprefix}encoder.layers.{i}.", f"v.blk.{i}."
        for gguf, hf, shape in (("ln1", "layer_norm1", (d,)), ("attn_q", "self_attn.q_proj", (d, d)),
                                ("attn_k", "self_attn.k_proj", (d, d)),
                                ("attn_v", "self_attn.v_proj", (d, d)),
                                ("attn_out", "self_attn.out_proj", (d, d)),
                                ("ln2", "layer_norm2", (d,)), ("ffn_up", "mlp.fc1", (n_ff, d)),
                                ("ffn_down", "mlp.fc2", (d, n_ff))):
            add(f"{b}{gguf}.weight", f"{p}{hf}.weight", shape)
            add(f"{b}{gguf}.bias", f"{p}{hf}.bias", (shape[0],))
    add("v.post_ln.weight", f"{vprefix}post_layernorm.weight", (d,))
    add("v.post_ln.bias", f"{vprefix}post_layernorm.bias", (d,))
    add("mm.input_projection.weight", f"{pprefix}mm_input_projection_weight", (d, n_text),
        GGMLQuantizationType.F16 if matrix_type != f32 else f32)
    add("mm.soft_emb_norm.weight", f"{pprefix}mm_soft_emb_norm.weight", (d,),
        fn=lambda v: v + np.float32(1.0))

    used = {hf for _, hf, *_ in specs}
    left = sorted(n for n in names if n.startswith(vprefix) and n not in used
                  and not n.removeprefix(vprefix).startswith(UNUSED_VISION)
                  or n.startswith(pprefix) and n not in used)
    if left:
        raise ConvertError(f"{folder}: vision tensor {left[0]} has no place in a gemma3 mmproj "
                           f"({len(left)} such tensors)")
    plans = []
    for gguf_name, hf_name, shape, qtype, fn in specs:
        entry = names.get(hf_name)
        if entry is None:
            raise ConvertError(f"{folder}: tensor {hf_name} is missing (the vision tower needs it)")
        if tuple(entry.shape) != shape:
            raise ConvertError(f"{entry.file}: tensor {hf_name} has shape {list(entry.shape)}, "
                               f"config.json implies {list(shape)}")

        def load(hf_name=hf_name, fn=fn):
            values = checkpoint.read_f32(hf_name)
            return fn(values) if fn else values
        plans.append(TensorPlan(gguf_name, shape, qtype, load))

    def set_metadata(w: GGUFWriter) -> None:
        w.add_name(name)
        w.add_type("mmproj")
        w.add_file_type(1 if matrix_type != f32 else 0)
        w.add_clip_has_vision_encoder(True)
        w.add_clip_projector_type("gemma3")
        w.add_vision_projection_dim(n_text)
        w.add_vision_image_size(image_size)
        w.add_vision_patch_size(patch)
        w.add_vision_embedding_length(d)
        w.add_vision_feed_forward_length(n_ff)
        w.add_vision_block_count(n_layer)
        w.add_vision_head_count(n_head)
        w.add_vision_image_mean(mean)
        w.add_vision_image_std(std)
        w.add_vision_attention_layernorm_eps(float(vision["layer_norm_eps"]))
        w.add_vision_use_gelu(True)
        if scale_factor != DEFAULT_SCALE_FACTOR:
            w.add_vision_projector_scale_factor(scale_factor)

    write_gguf(out, "clip", set_metadata, plans, force=force, progress=progress,
               label=f"{folder.name} -> {out.name}")
    return len(plans)
