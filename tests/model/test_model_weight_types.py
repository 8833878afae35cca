"""Models whose weights are the ternary, MXFP4 and grid i-quant types (tq1_0, tq2_0, mxfp4, iq2_xxs,
iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m): a tiny random Qwen2 checkpoint whose every matrix
(embedding and output head included) is stored in one such type, run by ember against
transformers on the weights dequantized by gguf-py.

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
import pytest
import tiny_models
import torch
from checkpoints import TWIN_MAX, TWIN_RMS, rel_rms
from gguf import GGMLQuantizationType as GT

from ember import _core
from ember.commands.info import describe

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


@pytest.fixture(scope="module")
def model():
    # 256 / 512 wide: every matrix row is whole 256-element super-blocks.
    return tiny_models.make_model("qwen2", hidden_size=256, intermediate_size=512, seed=3)


@pytest.mark.parametrize("name", GGUF_QUANTIZES + RANDOM_BLOCKS)
def test_logits_match_the_dequantized_weights(name: str, model, tmp_path: Path) -> None:
    path = write_typed(model, tmp_path / f"{name}.gguf", name, tmp_path)
    types = describe(path)["tensor_types"]  # what `ember info` lists
    assert set(types) == {"f32", name}, types
    assert types[name]["count"] == 2 + 7 * 2  # embedding, output, 7 matrices per layer
    tokens = np.random.default_rng(1).integers(0, 256, 40).tolist()
    ours = _core.Model(str(path), n_threads=2).eval(tokens)
    ref = tiny_models.hf_logits(dequantized_twin(model, path), tokens)
    # The bounds of every quantized type (tests/checkpoints.py): the f16 KV cache and the 8-bit
    # activations of the matmuls.
    assert rel_rms(ours, ref) < TWIN_RMS, rel_rms(ours, ref)
    assert np.abs(ours - ref).max() < TWIN_MAX * np.abs(ref).max()
