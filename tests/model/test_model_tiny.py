"""Every supported architecture against transformers, on tiny random checkpoints written to GGUF
the way llama.cpp's converter writes them (see tiny_models.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_models

from ember import _core

# All weights are f32 and match transformers exactly; what differs is the KV cache, which ember
# keeps in f16: each cached K/V value is rounded by up to 2^-11 relative (half an f16 ulp).
# Through two layers that moves logits of magnitude ~5 by ~5e-3 (measured: at most 5.3e-3
# here), while float32 summation-order differences stay near 1e-6. A wrong RoPE layout,
# scaling, permutation, bias or norm moves logits by O(1) (a swapped RoPE scaling: ~5), so
# 4e-3 of the largest logit (~8 half-ulps of f16) separates the two with room on both sides.
REL_TOL = 4e-3

CASES = {
    "llama": {"arch": "llama"},
    "llama-tied": {"arch": "llama", "tied": True},
    "llama-headdim": {"arch": "llama", "head_dim": 32},  # q width 128 != hidden 64
    "llama-headdim12": {"arch": "llama", "head_dim": 12},  # not a multiple of 8: scalar kernels
    "qwen3-headdim128": {"arch": "qwen3", "head_dim": 128},
    "qwen2": {"arch": "qwen2"},
    "qwen2-tied": {"arch": "qwen2", "tied": True},
    "qwen3": {"arch": "qwen3"},
    "qwen3-tied": {"arch": "qwen3", "tied": True},
    "llama-theta": {"arch": "llama", "rope": {"rope_theta": 500000.0}},
    "llama-linear": {"arch": "llama", "rope": {"rope_type": "linear", "factor": 4.0}},
    "qwen2-linear": {"arch": "qwen2", "rope": {"rope_type": "linear", "factor": 2.0}},
    "llama-llama3": {"arch": "llama", "rope": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}},
}


def _tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 256, n).tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case: str, tmp_path: Path) -> None:
    spec = dict(CASES[case])
    arch = spec.pop("arch")
    hf = tiny_models.make_model(arch, **spec)
    path = tiny_models.write_gguf(hf, tmp_path / f"{case}.gguf", arch)
    model = _core.Model(str(path), n_threads=2)
    assert model.architecture == arch
    assert model.n_vocab == 256

    tokens = _tokens(100)
    ours = model.eval(tokens)
    ref = tiny_models.hf_logits(hf, tokens)
    assert ours.shape == ref.shape == (100, 256)
    assert ours.dtype == np.float32
    tol = REL_TOL * np.abs(ref).max()
    assert np.abs(ours - ref).max() < tol
    # Same greedy choice at every position, except where transformers' top two are a near tie
    # (closer than the tolerance), in which case ours must pick one of the tied tokens.
    rows = np.arange(len(tokens))
    picked = ours.argmax(-1)
    assert (ref[rows, picked] >= ref.max(-1) - 2 * tol).all()
    assert (picked == ref.argmax(-1)).mean() > 0.95


@pytest.mark.parametrize("arch", tiny_models.ARCHS)
def test_chunked_prefill_and_decode_match_one_pass(arch: str, tmp_path: Path) -> None:
    """Micro-batches (n_batch=7), continuation (reset=False) and eval_last agree with one pass."""
    hf = tiny_models.make_model(arch, seed=1)
    path = tiny_models.write_gguf(hf, tmp_path / "m.gguf", arch)
    tokens = _tokens(40, seed=1)
    full = _core.Model(str(path)).eval(tokens)

    chunked = _core.Model(str(path), n_batch=7)
    assert chunked.n_batch == 7
    np.testing.assert_allclose(chunked.eval(tokens), full, rtol=0, atol=1e-4)

    step = _core.Model(str(path))
    rows = [step.eval(tokens[:25])]
    rows += [step.eval([t], reset=False) for t in tokens[25:]]
    assert step.n_past == 40
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=1e-4)

    last = step.eval_last(tokens[:30])  # reset=True: starts over
    assert last.shape == (256,)
    assert step.n_past == 30
    np.testing.assert_allclose(last, full[29], rtol=0, atol=1e-4)


_ISA_SCRIPT = """
import sys, numpy as np
from ember import _core
m = _core.Model(sys.argv[1], n_threads=2, n_batch=16)
np.save(sys.argv[2], m.eval(list(range(0, 256, 5))))
"""


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "amx"])
def test_isa_variants_agree(isa: str, tmp_path: Path) -> None:
    """The scalar and SIMD kernels (chosen at start-up, capped by EMBER_CPU_ISA) agree."""
    import os
    import subprocess
    import sys

    hf = tiny_models.make_model("llama", head_dim=64, seed=2)
    path = tiny_models.write_gguf(hf, tmp_path / "m.gguf", "llama")
    ref = tiny_models.hf_logits(hf, list(range(0, 256, 5)))
    out = tmp_path / "logits.npy"
    env = dict(os.environ, EMBER_CPU_ISA=isa)
    subprocess.run([sys.executable, "-c", _ISA_SCRIPT, str(path), str(out)], env=env, check=True)
    ours = np.load(out)
    assert np.abs(ours - ref).max() < REL_TOL * np.abs(ref).max()
