"""ember: a portable LLM inference engine for GGUF models.

    import ember
    f = ember.GGUFFile("model.gguf")       # metadata, tensor directory, zero-copy tensor views
    blocks = ember.quantize(array, "q4_0")  # float32 -> GGUF blocks
    llm = ember.LLM()                        # the demo model; or ember.LLM("model.gguf")
    print(llm.generate("Once upon a time", max_tokens=32).text)
"""

from __future__ import annotations

from ember import _core
from ember._core import (
    EmberError,
    GGUFError,
    GGUFFile,
    InvalidArgument,
    Model,
    StreamDecoder,
    TensorInfo,
    Tokenizer,
    UnsupportedError,
)
from ember.chat.template import ChatTemplate, ChatTemplateError
from ember.embeddings import Embedder
from ember.engine import (
    Engine,
    EngineBusy,
    EngineError,
    EngineOptions,
    InvalidRequest,
    PromptTooLong,
    Request,
)
from ember.llm import LLM
from ember.results import Delta, GenerationResult, Timings, TokenLogprob, Usage
from ember.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "ChatTemplate",
    "ChatTemplateError",
    "Delta",
    "Embedder",
    "Engine",
    "EngineBusy",
    "EngineError",
    "EngineOptions",
    "GenerationResult",
    "SamplingParams",
    "Timings",
    "TokenLogprob",
    "Usage",
    "EmberError",
    "GGUFError",
    "GGUFFile",
    "InvalidArgument",
    "InvalidRequest",
    "Model",
    "PromptTooLong",
    "Request",
    "StreamDecoder",
    "TensorInfo",
    "Tokenizer",
    "UnsupportedError",
    "__version__",
    "dequantize",
    "quantize",
]


def quantize(array, type_name: str) -> bytes:
    """Quantize a float32 array (last dimension a multiple of the block size) to GGUF blocks."""
    return _core.quantize(array, type_name)


def dequantize(raw, type_name: str, n_elements: int):
    """Decode n_elements values of type `type_name` from raw GGUF block bytes to float32."""
    return _core.dequantize(type_name, raw, n_elements)
