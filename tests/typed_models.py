"""Tiny models whose matrices are stored in one GGUF weight type that neither ember's converter
nor gguf-py's writer produces by default (tq1_0, tq2_0, mxfp4 and the grid i-quants), and their
transformers twins on the weights gguf-py dequantizes.

gguf-py quantizes tq1_0, tq2_0 and mxfp4 itself; it cannot write the i-quants, so their blocks
are random bytes with the f16 super-block scale set for the weights' spread (every grid index,
sign pattern and sub-block scale is a valid encoding, so random blocks are real weights).
"""

from __future__ import annotations

import copy
from pathlib import Path

import gguf
import gguf_builder
import numpy as np
import tiny_models
import torch
from gguf import GGMLQuantizationType as GT

GGUF_QUANTIZES = ["tq1_0", "tq2_0", "mxfp4"]
RANDOM_BLOCKS = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]

# transformers' names of the GGUF tensors of a dense Qwen2 model.
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}
LAYER = {"attn_norm.weight": "input_layernorm.weight",
         "ffn_norm.weight": "post_attention_layernorm.weight",
         "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         **{f"attn_{p}.{k}": f"self_attn.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")}}


def set_scale(raw: np.ndarray, qtype: GT, bits: int) -> None:
    """Every block's f16 super-block scale d := bits (raw: [n_blocks, type_size])."""
    if qtype == GT.IQ1_M:  # d's nibbles are the top nibbles of the four u16 scale words
        words = raw[:, -8:].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 15) << 12)
        raw[:, -8:] = words.view(np.uint8)
    else:  # the other i-quants lead with d
        raw[:, 0:2] = np.array([bits], dtype=np.uint16).view(np.uint8)


def random_blocks(qtype: GT, n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """n values of random blocks of `qtype` (flat uint8) whose dequantized values have about `std`."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n // block_size, type_size), dtype=np.uint8)
    set_scale(raw, qtype, int(np.float16(1.0).view(np.uint16)))
    unit = float(np.std(gguf.quants.dequantize(raw, qtype)))
    set_scale(raw, qtype, int(np.float16(std / unit).view(np.uint16)))
    return raw.reshape(-1)


def write_typed(model, path: Path, name: str, tmp_path: Path) -> Path:
    """`model` as GGUF at `path` with every 2-D tensor in type `name`."""
    f32 = tiny_models.write_gguf(model, tmp_path / "f32.gguf", "qwen2")
    reader = gguf.GGUFReader(f32)
    kv = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        types = [int(t) for t in field.types]
        value = (types[1], field.contents()) if types[0] == gguf_builder.ARRAY else field.contents()
        kv.append((field.name, types[0], value))
    qtype = GT[name.upper()]
    rng = np.random.default_rng(0)
    tensors = []
    for t in reader.tensors:
        values = np.array(t.data, dtype=np.float32)
        if values.ndim == 2:
            if name in GGUF_QUANTIZES:
                data = gguf.quants.quantize(values, qtype)
            else:
                data = random_blocks(qtype, values.size, float(values.std()), rng)
            tensors.append(gguf_builder.Tensor(t.name, [int(d) for d in t.shape], int(qtype), data.tobytes()))
        else:
            tensors.append(gguf_builder.Tensor(t.name, [int(d) for d in t.shape], 0, values.tobytes()))
    path.write_bytes(gguf_builder.build(kv, tensors).data)
    return path


def dequantized_twin(model, path: Path):
    """`model` carrying the weights stored in GGUF `path`, dequantized by gguf-py."""
    state = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        values = np.array(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape), dtype=np.float32)
        layer, _, rest = t.name.removeprefix("blk.").partition(".")
        key = TOP.get(t.name) or f"model.layers.{layer}.{LAYER[rest]}"
        state[key] = torch.from_numpy(values)
    twin = copy.deepcopy(model)
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return twin


def make_model():
    """A random Qwen2 (no Q/K permutation in its file) 256 / 512 wide: every matrix row is whole
    256-element super-blocks."""
    return tiny_models.make_model("qwen2", hidden_size=256, intermediate_size=512, seed=3)
