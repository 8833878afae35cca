"""SmolLM3 (GGUF architecture "smollm3"): Llama with NoPE layers, which attend without rotating
Q and K. config.json's no_rope_layers holds one flag per layer, 1 for a layer that does use RoPE
(and 0 for NoPE), else every no_rope_layer_interval-th layer is NoPE (transformers' rule).

llama.cpp's converter writes SmolLM3 as Llama under its own architecture name, with no key for the
NoPE layers: llama.cpp's smollm3 code makes every 4th layer NoPE, the published models' pattern.
ember also writes the flags, as {arch}.attention.rope_pattern (the key llama.cpp's granite_swa
reads from the same config field), and reads them back; a file with another pattern runs right in
ember only (ember convert says so)."""

from __future__ import annotations

import logging

from gguf import GGUFWriter

from .base import HParams
from .checkpoint import Checkpoint
from .errors import ConvertError
from .llama import LlamaFamily
from .registry import register

log = logging.getLogger(__name__)

LLAMA_CPP_NOPE_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step for smollm3


@register("SmolLM3ForCausalLM")
class SmolLM3Family(LlamaFamily):
    gguf_arch = "smollm3"

    def __init__(self, hp: HParams, checkpoint: Checkpoint, where: str, config: dict) -> None:
        super().__init__(hp, checkpoint, where, config)
        if config.get("use_sliding_window"):
            raise ConvertError(f"{where}: use_sliding_window is true; ember runs SmolLM3 with "
                               "global attention on every layer only")
        self.sliding_window = 0  # sliding_window only counts with use_sliding_window
        flags = config.get("no_rope_layers")
        if flags is None:
            interval = config.get("no_rope_layer_interval", LLAMA_CPP_NOPE_INTERVAL)
            if not isinstance(interval, int) or interval <= 0:
                raise ConvertError(f"{where}: no_rope_layer_interval is {interval!r}, expected a "
                                   "positive integer")
            flags = [int((i + 1) % interval != 0) for i in range(hp.n_layer)]
        if (not isinstance(flags, list) or len(flags) != hp.n_layer or
                any(f not in (0, 1) for f in flags)):
            raise ConvertError(f"{where}: no_rope_layers is {flags!r}, expected {hp.n_layer} "
                               "flags of 0 (NoPE) or 1 (RoPE), one per layer")
        self.rope_layers = [bool(f) for f in flags]
        default = [(i + 1) % LLAMA_CPP_NOPE_INTERVAL != 0 for i in range(hp.n_layer)]
        if self.rope_layers != default:
            log.warning("%s: NoPE layers %s are not llama.cpp's every-4th pattern: llama.cpp "
                        "will run this file with the wrong layers rotating", where,
                        [i for i, rotates in enumerate(self.rope_layers) if not rotates])

    def add_metadata(self, w: GGUFWriter) -> None:
        super().add_metadata(w)
        w.add_array(f"{self.gguf_arch}.attention.rope_pattern", self.rope_layers)
