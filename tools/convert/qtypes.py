"""Output types (--type) and the type each tensor gets under them, following llama.cpp.

Float types and q8_0 follow convert_hf_to_gguf.py: 1-D tensors, norms and biases stay f32, every
other weight takes the type, and a q8_0 row that is not whole blocks falls back to f16. The other
quantized types follow llama-quantize (llama_tensor_get_type in llama-quant.cpp) without an
importance matrix: the output projection (or the token embedding when it doubles as the output)
gets q6_k, and the *_k_m mixes give attn_v and ffn_down more bits in some layers. A tensor whose
rows are not whole blocks of its type falls back the way llama.cpp does (q4_k -> q5_0, q5_k ->
q5_1, q6_k -> q8_0, q2_k/q3_k -> iq4_nl; then f16). Ternary (tq1_0, tq2_0): the token embedding
gets q4_k, rows that are not whole blocks q4_0. mxfp4_moe: the experts' 3-D tensors mxfp4, every
other matrix (the output included) q8_0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from .errors import ConvertError

Q = GGMLQuantizationType


@dataclass(frozen=True)
class OutputType:
    """One --type choice."""

    name: str                 # as the user types it: "q4_k_m"
    file_type: LlamaFileType  # general.file_type
    base: GGMLQuantizationType  # the type of most 2-D weights
    llama_quantize: bool      # True: llama-quantize's per-tensor rules; False: the converter's


def _output_type(name: str, llama_quantize: bool) -> OutputType:
    """general.file_type is gguf's MOSTLY_<NAME> (ALL_F32 for f32); most 2-D weights take the
    block type the name starts with (q4_k_m: q4_k)."""
    file_type = LlamaFileType.ALL_F32 if name == "f32" else LlamaFileType[f"MOSTLY_{name.upper()}"]
    base = Q.MXFP4 if name == "mxfp4_moe" else Q[name.upper().removesuffix("_M")]
    return OutputType(name, file_type, base, llama_quantize)


# convert_hf_to_gguf.py's --outtype choices, then llama-quantize's.
OUTPUT_TYPES: dict[str, OutputType] = {t.name: t for t in (
    *(_output_type(name, False) for name in ("f32", "f16", "bf16", "q8_0")),
    *(_output_type(name, True) for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m", "q4_k_m",
                                             "q5_k_m", "q6_k", "tq1_0", "tq2_0", "mxfp4_moe")),
)}

FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
_BLOCK_FALLBACK = {Q.Q2_K: Q.IQ4_NL, Q.Q3_K: Q.IQ4_NL, Q.TQ1_0: Q.Q4_0, Q.TQ2_0: Q.Q4_0, Q.Q4_K: Q.Q5_0,
                   Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
_TERNARY = (LlamaFileType.MOSTLY_TQ1_0, LlamaFileType.MOSTLY_TQ2_0)
_LAYER = re.compile(r"^blk\.(\d+)\.")


def output_type(name: str) -> OutputType:
    t = OUTPUT_TYPES.get(name.lower())
    if t is None:
        raise ConvertError(f"unknown output type '{name}'; choose one of "
                           f"{', '.join(OUTPUT_TYPES)}")
    return t


def type_name(t: GGMLQuantizationType) -> str:
    """The name ember._core uses for a GGML type: q4_k, f16, ..."""
    return t.name.lower()


def block_size(t: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[t][0]


def n_bytes(t: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` (rows of whole blocks) stored as `t`."""
    block, type_bytes = GGML_QUANT_SIZES[t]
    n = int(np.prod(shape, dtype=np.int64))
    return n // block * type_bytes


@cache
def can_quantize(t: GGMLQuantizationType) -> bool:
    """Whether this build of ember._core has a quantizer for `t` (K-quants arrived later)."""
    if t == Q.F32:
        return True
    from ember import _core

    try:
        _core.quantize(np.zeros(block_size(t), np.float32), type_name(t))
    except Exception:  # noqa: BLE001 - any refusal means "not available"
        return False
    return True


@dataclass(frozen=True)
class ModelShape:
    """What the per-tensor rules need to know about the whole model."""

    n_layer: int
    n_gqa: int          # query heads per kv head
    has_output: bool    # a separate output.weight exists (else token_embd is the output too)
    n_expert: int = 0   # experts per layer (mixture of experts), 0 for dense models


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    return (i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8
            or (i_layer - n_layer // 8) % 3 == 2)


def _llama_quantize_type(out: OutputType, name: str, row: int, model: ModelShape
                         ) -> GGMLQuantizationType:
    """llama_tensor_get_type for the file types offered here (no imatrix)."""
    ft, t = out.file_type, out.base
    match = _LAYER.match(name)
    i_layer = int(match.group(1)) if match else 0
    n_layer = model.n_layer
    if name == "output.weight" or (not model.has_output and name == "token_embd.weight"):
        if row % block_size(t) != 0:
            t = Q.Q8_0
        elif t != Q.Q8_0:
            t = Q.Q6_K
    elif name == "token_embd.weight":
        if ft in _TERNARY:
            t = Q.Q4_K
    elif model.n_expert == 8 and ("attn_v.weight" in name or "attn_k.weight" in name):
        t = Q.Q8_0  # llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
    elif "attn_v.weight" in name:
        if ft == LlamaFileType.MOSTLY_Q2_K:
            t = Q.Q4_K if model.n_gqa >= 4 else Q.Q3_K
        elif ft == LlamaFileType.MOSTLY_Q3_K_M:
            t = Q.Q5_K if i_layer < 2 else Q.Q4_K
        elif (ft in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M)
              and _use_more_bits(i_layer, n_layer)):
            t = Q.Q6_K
    elif "ffn_down" in name:
        if ft == LlamaFileType.MOSTLY_Q2_K:
            t = Q.Q3_K
        elif ft == LlamaFileType.MOSTLY_Q3_K_M:
            t = Q.Q5_K if i_layer < n_layer // 16 else Q.Q4_K
        elif (ft in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M)
              and _use_more_bits(i_layer, n_layer)):
            t = Q.Q6_K
    elif "attn_output.weight" in name and model.n_expert == 8:
        if ft in (LlamaFileType.MOSTLY_Q2_K, LlamaFileType.MOSTLY_Q3_K_M, LlamaFileType.MOSTLY_Q4_K_M):
            t = Q.Q5_K
    elif "attn_output.weight" in name:
        if ft == LlamaFileType.MOSTLY_Q2_K:
            t = Q.Q3_K
        elif ft == LlamaFileType.MOSTLY_Q3_K_M:
            t = Q.Q4_K
    if row % block_size(t) != 0:
        t = _BLOCK_FALLBACK.get(t, Q.F16)
        if row % block_size(t) != 0:
            t = Q.F16
    return t


# Tables llama.cpp always keeps in f32 (its converter and quantizer), whatever the output type:
# these, and every layer's expert routers.
ALWAYS_F32 = ("position_embd.weight", "token_types.weight")
ALWAYS_F32_IN_LAYERS = (".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight")


def tensor_type(out: OutputType, name: str, shape: tuple[int, ...], model: ModelShape
                ) -> GGMLQuantizationType:
    """The type tensor `name` of `shape` (numpy order, rows last) is written as under `out`."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return Q.F32
    if name in ALWAYS_F32 or name.endswith(ALWAYS_F32_IN_LAYERS):
        return Q.F32
    if out.base in FLOAT_TYPES:
        return out.base
    row = shape[-1]
    if not out.llama_quantize:  # q8_0, as convert_hf_to_gguf.py writes it
        return out.base if row % block_size(out.base) == 0 else Q.F16
    if out.file_type == LlamaFileType.MOSTLY_MXFP4_MOE:  # experts mxfp4, every other matrix q8_0
        return (Q.MXFP4 if len(shape) == 3 else Q.Q8_0) if row % 32 == 0 else Q.F16
    return _llama_quantize_type(out, name, row, model)


def encode(values: np.ndarray, t: GGMLQuantizationType) -> np.ndarray:
    """float32 values -> the bytes of `t` (uint8 array), quantized by ember._core (threaded)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if t == Q.F32:
        return values.reshape(-1).view(np.uint8)
    from ember import _core

    return np.frombuffer(_core.quantize(values, type_name(t)), dtype=np.uint8)


def check_available(types: set[GGMLQuantizationType], what: str) -> None:
    """Fail before writing anything when ember._core lacks a quantizer the plan needs."""
    missing = sorted(type_name(t) for t in types if not can_quantize(t))
    if missing:
        raise ConvertError(f"{what} needs {', '.join(missing)} quantization, which this build of "
                           f"ember._core does not provide (the K-quant quantizers are not in it "
                           f"yet); pick f16, bf16, q8_0 or another type")
