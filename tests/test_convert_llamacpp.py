"""Files written by ember.convert load and run in llama.cpp (through llama-cpp-python, which is
not a dependency: `pip install llama-cpp-python` builds llama.cpp; these tests skip without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember import _core
from ember.convert import convert

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")


@pytest.fixture(autouse=True)
def _no_extra_buffer_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load weights as stored, without llama.cpp's CPU "extra buffer types" (AMX / repacked
    layouts): on this AMX machine llama.cpp 0.3.36 segfaults in decode on any q8_0 tensor of
    stories260K's size, also for the bytes gguf-py's own quantizer writes (checked: identical
    files). The repacking happens after loading and does not change what the file means."""
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    monkeypatch.setattr(llama_cpp.llama.llama_cpp, "llama_model_default_params", params)


def _llama_cpp_model(path: Path):
    # logits_all: llama-cpp-python 0.3.36 leaves `scores` zero without it, even the last row.
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, n_batch=256,
                           logits_all=True, verbose=False)


def _greedy_llama_cpp(path: Path, prompt: list[int], n: int) -> list[int]:
    llm = _llama_cpp_model(path)
    tokens = list(prompt)
    llm.eval(tokens)
    for _ in range(n):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(tokens[-1:])
    return tokens


def _greedy_ember(path: Path, prompt: list[int], n: int) -> list[int]:
    model = _core.Model(str(path), n_threads=1)
    tokens = list(prompt)
    logits = model.eval_last(tokens)
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = model.eval_last(tokens[-1:], reset=False)
    return tokens


@pytest.mark.parametrize("out_type", ["f32", "f16", "q8_0", "q4_k_m"])
def test_stories_greedy_same_in_llama_cpp(out_type: str, tmp_path: Path,
                                          stories_hf_path: Path) -> None:
    out = tmp_path / f"stories-{out_type}.gguf"
    convert(stories_hf_path, out, out_type, progress=False)
    prompt = [1, 403, 407, 261]
    ours = _greedy_ember(out, prompt, 40)
    theirs = _greedy_llama_cpp(out, prompt, 40)
    assert ours == theirs


@pytest.mark.parametrize("case", ["llama", "mistral", "qwen2", "qwen3-tied", "llama-llama3"])
@pytest.mark.parametrize("out_type", ["f32", "q4_k_m"])
def test_tiny_models_same_logits_in_llama_cpp(case: str, out_type: str, tmp_path: Path) -> None:
    from test_convert_models import (
        F32_REL,
        _rel_rms,
        dequantized_model,
        hf_logits,
        make_model,
        save_checkpoint,
        tokens_for_test,
    )

    model = make_model(case)
    folder = save_checkpoint(model, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    convert(folder, out, out_type, progress=False)
    tokens = tokens_for_test(64)
    llm = _llama_cpp_model(out)
    llm.eval(tokens)
    theirs = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    ours = _core.Model(str(out), n_threads=1).eval(tokens)
    if out_type == "f32":
        # Same f32 weights, both engines with an f16 KV cache: see test_convert_models.F32_REL.
        ref = hf_logits(model, tokens)
        assert np.abs(theirs - ref).max() < F32_REL * np.abs(ref).max()
        assert np.abs(ours - theirs).max() < F32_REL * np.abs(theirs).max()
        return
    # llama.cpp on our q4_k_m file computes what transformers computes with the weights the
    # file stores (dequantized), up to its own 8-bit activation rounding (q8_K: one scale per
    # 256 values, coarser than ember's): measured 2.4-3.3% RMS, 2.6-3.6% of the largest logit.
    # The two engines then differ by both roundings: measured 2.9-3.9% RMS. A block llama.cpp
    # decoded differently from ember (a format mismatch) would move logits by tens of percent.
    twin = hf_logits(dequantized_model(model, out), tokens)
    assert _rel_rms(theirs, twin) < 0.05
    assert np.abs(theirs - twin).max() < 0.06 * np.abs(twin).max()
    assert _rel_rms(ours, theirs) < 0.06
