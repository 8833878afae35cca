"""Models whose weights are the ternary, MXFP4 and grid i-quant types (tq1_0, tq2_0, mxfp4, iq2_xxs,
iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m): a tiny random Qwen2 checkpoint whose every matrix
(embedding and output head included) is stored in one such type (tests/typed_models.py), run by
ember against transformers on the weights dequantized by gguf-py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_models
import typed_models
from checkpoints import TWIN_MAX, TWIN_RMS, rel_rms
from typed_models import GGUF_QUANTIZES, RANDOM_BLOCKS, dequantized_twin, write_typed

from ember import _core
from ember.commands.info import describe


@pytest.fixture(scope="module")
def model():
    return typed_models.make_model()


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
