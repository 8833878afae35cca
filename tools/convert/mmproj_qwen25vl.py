"""Qwen2.5-VL's vision tower and patch merger to an mmproj GGUF in llama.cpp's clip layout
(projector type "qwen2.5vl_merger"), as convert_hf_to_gguf.py's Qwen2VLVisionModel writes it:

- the Conv3d patch embedding [n_embd, 3, 2, 14, 14] split along its two temporal frames into
  v.patch_embd.weight and v.patch_embd.weight.1 (each [n_embd, 3, 14, 14]; an image is its frame
  twice, so the two apply to the same pixels and add up);
- each block's fused qkv split into attn_q, attn_k, attn_v (weights and biases); norm1/norm2 are
  ln1/ln2 (RMSNorm, clip.use_silu: the SwiGLU feed-forward), attn.proj is attn_out;
- merger.ln_q is v.post_ln, merger.mlp.0 / mlp.2 are mm.0 / mm.2;
- fullatt_block_indexes as clip.vision.n_wa_pattern (every n-th block full attention, the others
  windowed), window_size as clip.vision.window_size (llama.cpp's qwen2.5vl code assumes 112, the
  published checkpoints' value, and does not read it), image_mean / image_std and min_pixels /
  max_pixels (as clip.vision.image_min_pixels / image_max_pixels, the image sizes transformers
  resizes into; llama.cpp's qwen2.5vl code uses its own, 8 to 4096 merged tokens, as ember does
  for a file without them) from preprocessor_config.json.

Float types as llama.cpp's converter: 1-D tensors f32, matrices in the output type (f16 for a
quantized --type: vision towers are small and precision-sensitive), the patch embedding f16 or f32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFType, GGUFWriter, LlamaFileType

from .checkpoint import Checkpoint
from .errors import ConvertError
from .qtypes import OutputType
from .writer import TensorPlan, write_gguf

Q = GGMLQuantizationType
PROJECTOR_TYPE = "qwen2.5vl_merger"
DEFAULT_IMAGE_SIZE = 560   # what llama.cpp's converter writes when config.json has none
VISION_RMS_EPS = 1e-6      # transformers' Qwen2_5_VLRMSNorm in the tower and merger: fixed


class Qwen25VLVision:
    """config.json's vision_config (and the text width it projects to), checked against the
    checkpoint's visual.* tensors."""

    def __init__(self, checkpoint: Checkpoint, config: dict, where: str) -> None:
        v = config.get("vision_config")
        if not isinstance(v, dict):
            raise ConvertError(f"{where}: no vision_config; cannot write a vision projector")
        text = {**config, **(config.get("text_config") or {})}

        def need(obj: dict, key: str) -> int:
            value = obj.get(key)
            if not isinstance(value, int) or value <= 0:
                raise ConvertError(f"{where}: {key} is {value!r}, expected a positive integer")
            return value

        self.checkpoint = checkpoint
        self.n_embd = need(v, "hidden_size")
        self.n_ff = need(v, "intermediate_size")
        self.n_layer = need(v, "depth")
        self.n_head = need(v, "num_heads")
        self.n_out = need(v, "out_hidden_size")
        self.patch = need(v, "patch_size")
        self.merge = need(v, "spatial_merge_size")
        self.window = need(v, "window_size")
        if self.n_out != need(text, "hidden_size"):
            raise ConvertError(f"{where}: vision out_hidden_size {self.n_out} differs from the text "
                               f"model's hidden_size {text['hidden_size']}")
        if v.get("temporal_patch_size", 2) != 2 or v.get("in_channels", 3) != 3:
            raise ConvertError(f"{where}: temporal_patch_size {v.get('temporal_patch_size')} and "
                               f"in_channels {v.get('in_channels')}: only 2 and 3 are supported")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 4:
            raise ConvertError(f"{where}: vision hidden_size {self.n_embd} over {self.n_head} heads "
                               "must give a head size that is a multiple of 4 (2-D RoPE)")
        full = v.get("fullatt_block_indexes")
        if not isinstance(full, list) or not full:
            raise ConvertError(f"{where}: vision_config.fullatt_block_indexes is {full!r}, "
                               "expected the list of full-attention blocks")
        self.n_wa_pattern = full[0] + 1
        if full != list(range(full[0], self.n_layer, self.n_wa_pattern)):
            raise ConvertError(f"{where}: fullatt_block_indexes {full} is not every "
                               f"{self.n_wa_pattern}-th block, the only layout "
                               "clip.vision.n_wa_pattern can say")
        self.image_size = int(v.get("image_size", DEFAULT_IMAGE_SIZE))
        self.image_mean, self.image_std, self.pixel_limits = _preprocessing(checkpoint.folder)

    def specs(self) -> list[tuple[str, str, tuple[int, ...], slice | None]]:
        """(GGUF name, checkpoint name, GGUF shape, rows of the checkpoint tensor or None)."""
        e, f, merged = self.n_embd, self.n_ff, self.n_embd * self.merge * self.merge
        patch = (e, 3, self.patch, self.patch)
        out = [("v.patch_embd.weight", "visual.patch_embed.proj.weight", patch, None),
               ("v.patch_embd.weight.1", "visual.patch_embed.proj.weight", patch, None)]
        for i in range(self.n_layer):
            p, b = f"visual.blocks.{i}.", f"v.blk.{i}."
            for j, proj in enumerate("qkv"):
                rows = slice(j * e, (j + 1) * e)
                out.append((f"{b}attn_{proj}.weight", p + "attn.qkv.weight", (e, e), rows))
                out.append((f"{b}attn_{proj}.bias", p + "attn.qkv.bias", (e,), rows))
            out += [
                (b + "attn_out.weight", p + "attn.proj.weight", (e, e), None),
                (b + "attn_out.bias", p + "attn.proj.bias", (e,), None),
                (b + "ln1.weight", p + "norm1.weight", (e,), None),
                (b + "ln2.weight", p + "norm2.weight", (e,), None),
                (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", (f, e), None),
                (b + "ffn_gate.bias", p + "mlp.gate_proj.bias", (f,), None),
                (b + "ffn_up.weight", p + "mlp.up_proj.weight", (f, e), None),
                (b + "ffn_up.bias", p + "mlp.up_proj.bias", (f,), None),
                (b + "ffn_down.weight", p + "mlp.down_proj.weight", (e, f), None),
                (b + "ffn_down.bias", p + "mlp.down_proj.bias", (e,), None),
            ]
        out += [
            ("v.post_ln.weight", "visual.merger.ln_q.weight", (e,), None),
            ("mm.0.weight", "visual.merger.mlp.0.weight", (merged, merged), None),
            ("mm.0.bias", "visual.merger.mlp.0.bias", (merged,), None),
            ("mm.2.weight", "visual.merger.mlp.2.weight", (self.n_out, merged), None),
            ("mm.2.bias", "visual.merger.mlp.2.bias", (self.n_out,), None),
        ]
        return out

    def plans(self, out: OutputType) -> list[TensorPlan]:
        ckpt = self.checkpoint
        expected = {"visual.patch_embed.proj.weight": (self.n_embd, 3, 2, self.patch, self.patch)}
        for _, hf_name, shape, rows in self.specs():
            if hf_name in expected:
                continue
            expected[hf_name] = (3 * shape[0], *shape[1:]) if rows is not None else shape
        for hf_name, shape in expected.items():
            entry = ckpt.entries.get(hf_name)
            if entry is None:
                raise ConvertError(f"{ckpt.folder}: tensor {hf_name} is missing (a Qwen2.5-VL vision "
                                   f"tower of {self.n_layer} blocks needs it)")
            if entry.shape != shape:
                raise ConvertError(f"{entry.file}: tensor {hf_name} has shape {list(entry.shape)}, "
                                   f"config.json implies {list(shape)}")
        matrix = _matrix_type(out)
        plans = []
        for gguf_name, hf_name, shape, rows in self.specs():
            if gguf_name.startswith("v.patch_embd"):
                qtype = Q.F16 if matrix == Q.F16 else Q.F32
            else:
                qtype = matrix if len(shape) > 1 else Q.F32
            plans.append(TensorPlan(gguf_name, shape, qtype, self._loader(gguf_name, hf_name, rows)))
        return plans

    def _loader(self, gguf_name: str, hf_name: str, rows: slice | None):
        def load() -> np.ndarray:
            values = self.checkpoint.read_f32(hf_name)
            if gguf_name.startswith("v.patch_embd"):
                return np.ascontiguousarray(values[:, :, 1 if gguf_name.endswith(".1") else 0])
            return np.ascontiguousarray(values[rows]) if rows is not None else values
        return load

    def add_metadata(self, w: GGUFWriter, out: OutputType) -> None:
        w.add_type(GGUFType.MMPROJ)
        w.add_file_type(int(_FILE_TYPES.get(_matrix_type(out), LlamaFileType.MOSTLY_F16)))
        w.add_clip_has_vision_encoder(True)
        w.add_clip_projector_type(PROJECTOR_TYPE)
        w.add_vision_use_silu(True)
        w.add_vision_projection_dim(self.n_out)
        w.add_vision_image_size(self.image_size)
        w.add_vision_patch_size(self.patch)
        w.add_vision_embedding_length(self.n_embd)
        w.add_vision_feed_forward_length(self.n_ff)
        w.add_vision_block_count(self.n_layer)
        w.add_vision_head_count(self.n_head)
        w.add_vision_attention_layernorm_eps(VISION_RMS_EPS)
        w.add_vision_image_mean(self.image_mean)
        w.add_vision_image_std(self.image_std)
        w.add_vision_n_wa_pattern(self.n_wa_pattern)
        w.add_uint32("clip.vision.spatial_merge_size", self.merge)
        w.add_uint32("clip.vision.window_size", self.window)
        if self.pixel_limits is not None:
            w.add_vision_min_pixels(self.pixel_limits[0])
            w.add_vision_max_pixels(self.pixel_limits[1])


_FILE_TYPES = {Q.F32: LlamaFileType.ALL_F32, Q.F16: LlamaFileType.MOSTLY_F16,
               Q.BF16: LlamaFileType.MOSTLY_BF16}


def _matrix_type(out: OutputType) -> GGMLQuantizationType:
    """The type of the tower's matrices: a float --type's own, f16 for a quantized one."""
    return out.base if out.base in _FILE_TYPES else Q.F16


def _preprocessing(folder: Path) -> tuple[list[float], list[float], tuple[int, int] | None]:
    """image_mean, image_std and (min_pixels, max_pixels) (None when not given) from
    preprocessor_config.json (or processor_config.json's image_processor), as llama.cpp's
    converter reads them."""
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            cfg = json.loads(path.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConvertError(f"{path}: cannot read it as JSON ({err})") from None
        cfg = {**cfg, **(cfg.get("image_processor") or {})}
        mean, std = cfg.get("image_mean"), cfg.get("image_std")
        if mean is not None and std is not None:
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ConvertError(f"{path}: image_mean {mean} and image_std {std} must be 3 values "
                                   "each, std > 0")
            limits = (cfg.get("min_pixels"), cfg.get("max_pixels"))
            size = cfg.get("size") or {}  # newer processors: size.shortest_edge / longest_edge
            limits = (limits[0] or size.get("shortest_edge"), limits[1] or size.get("longest_edge"))
            if limits[0] is None or limits[1] is None:
                pixel_limits = None
            elif not (0 < int(limits[0]) <= int(limits[1])):
                raise ConvertError(f"{path}: min_pixels {limits[0]} and max_pixels {limits[1]} must be "
                                   "> 0 and ordered")
            else:
                pixel_limits = (int(limits[0]), int(limits[1]))
            return [float(x) for x in mean], [float(x) for x in std], pixel_limits
    raise ConvertError(f"{folder}: no preprocessor_config.json with image_mean and image_std")


def write_mmproj(folder: Path, config: dict, where: str, out: Path, out_type: OutputType, *,
                 name: str, force: bool = False, progress: bool | None = None) -> int:
    """Writes the checkpoint's vision tower and merger to the mmproj `out`; returns its tensor count."""
    vision = Qwen25VLVision(Checkpoint(folder), config, where)
    plans = vision.plans(out_type)

    def set_metadata(w: GGUFWriter) -> None:
        w.add_name(name)
        vision.add_metadata(w, out_type)

    write_gguf(out, "clip", set_metadata, plans, force=force, progress=progress,
               label=f"{folder.name} vision -> {out.name}")
    return len(plans)
