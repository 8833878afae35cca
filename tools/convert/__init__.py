"""ember.convert: Hugging Face checkpoints to GGUF files that run in ember and in llama.cpp.

    from ember.convert import convert, quantize_gguf
    convert("path/to/hf-model-or-repo/id", "model.gguf", "q4_k_m")
    quantize_gguf("model-f16.gguf", "model-q4_k_m.gguf", "q4_k_m")
    convert_lora("path/to/peft-adapter", "adapter.gguf", "f16", base="path/to/base")

One module per architecture family (llama.py, qwen2.py, qwen3.py, bert.py, ...), registered by Hugging Face
class name in registry.py; importing this package registers them all.
"""

from __future__ import annotations

from . import bert, gemma3, gemma3_vision, gpt_oss, llama, phi3, qwen2, qwen2vl, qwen3, qwen_moe, smollm3  # noqa: F401  (registers the families)
from .convert import ConvertResult, convert
from .errors import ConvertError
from .lora import convert_lora
from .qtypes import OUTPUT_TYPES
from .registry import supported_architectures
from .requantize import quantize_gguf

__all__ = [
    "OUTPUT_TYPES",
    "ConvertError",
    "ConvertResult",
    "convert",
    "convert_lora",
    "quantize_gguf",
    "supported_architectures",
]
