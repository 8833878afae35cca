"""Qwen2.5-VL's language model (GGUF architecture "qwen2vl"): Qwen2 with multimodal RoPE, whose
rotated pairs fall into sections turned by a token's temporal, height and width positions
(rope_parameters.mrope_section, written as qwen2vl.rope.dimension_sections padded to four
entries, as llama.cpp's converter writes it). Its vision tower goes to a file of its own, the
mmproj (mmproj_qwen25vl.py).

The checkpoint keeps the text model's hyper-parameters in text_config (transformers 5) or at the
top level (the published checkpoints); the two are merged, text_config winning, as llama.cpp's
converter does.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import GGUFWriter

from .base import HParams
from .checkpoint import Checkpoint
from .errors import ConvertError
from .mmproj_qwen25vl import write_mmproj
from .qwen2 import Qwen2Family
from .registry import register


@register("Qwen2_5_VLForConditionalGeneration")
class Qwen2VLFamily(Qwen2Family):
    gguf_arch = "qwen2vl"

    @staticmethod
    def text_config(config: dict) -> dict:
        text = config.get("text_config") or {}
        merged = {**config, **text}
        merged["model_type"] = config.get("model_type", merged.get("model_type"))  # the vocab's
        return merged

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
        sections = rope.get("mrope_section")
        n_pairs = hp.head_dim // 2
        if (not isinstance(sections, list) or len(sections) != 3
                or not all(isinstance(s, int) and s >= 0 for s in sections) or sum(sections) != n_pairs):
            raise ConvertError(f"{where}: mrope_section is {sections!r}, expected three section "
                               f"sizes summing to head_dim / 2 = {n_pairs}")
        self.mrope_sections = sections
        self.config, self.where = config, where
        # "mrope" (the published configs' rope_scaling type) is M-RoPE itself, no scaling.
        scaling = hp.rope_scaling if hp.rope_scaling.get("rope_type") not in ("mrope",) else {}
        super().__init__(replace(hp, rope_scaling=scaling), checkpoint, where, config)

    def ignored(self, hf_name: str) -> bool:
        return hf_name.startswith("visual.") or super().ignored(hf_name)

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        w.add_rope_dimension_sections([*self.mrope_sections, 0])

    # convert() calls a family's mmproj(folder, config, out, out_type, ...) when it has one:
    # the vision tower and merger (mmproj_qwen25vl.py).
    mmproj = staticmethod(lambda folder, config, out, out_type, **kwargs: write_mmproj(
        folder, config, str(folder / "config.json"), out, out_type, **kwargs))
