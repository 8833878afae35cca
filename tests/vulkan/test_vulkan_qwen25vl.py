"""Qwen2.5-VL's vision tower on Vulkan against the CPU's, on the tiny random checkpoint
(tests/qwen25vl_support.py): both keep K/V in f16 and sum in f32 in different orders; the
device's exact GELU uses a polynomial erf (within 1.5e-7). Measured (f16 weights): the two agree
to 1.3e-6 and 9.5e-6 of the largest output, and each is within 1.7e-4 of transformers'
(tests/model/test_model_qwen25vl.py),
so 1e-4 of the largest output bounds the backends' difference with room, while any op of the
tower done wrong on one side (a window, a RoPE pass, a bias) moves outputs by O(1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qwen25vl_support import make_qwen25vl, save_qwen25vl
from test_vulkan import DEVICE

from ember import _core
from ember.convert import convert


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen25vl")
    save_qwen25vl(make_qwen25vl(), folder / "ckpt")
    return convert(folder / "ckpt", folder / "text.gguf", "f16", progress=False,
                   mmproj_out=folder / "mmproj.gguf").mmproj


@pytest.mark.parametrize("shape", [(56, 56), (84, 112)], ids=["56x56", "84x112"])
def test_vision_tower_is_the_cpus(mmproj: Path, shape) -> None:
    height, width = shape
    pixels = np.random.default_rng(3).standard_normal((3, height, width)).astype(np.float32)
    cpu = _core.VisionModel(str(mmproj), "cpu", 2).encode(pixels)
    device = _core.VisionModel(str(mmproj), DEVICE, 2)
    assert device.device != "cpu"
    ours = device.encode(pixels)
    assert ours.shape == cpu.shape == ((height // 28) * (width // 28), 64)
    assert np.abs(ours - cpu).max() < 1e-4 * np.abs(cpu).max()
