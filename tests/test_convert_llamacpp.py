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


def _llama_cpp_model(path: Path, logits_all: bool = False):
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, n_batch=256,
                           logits_all=logits_all, verbose=False)


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
    from test_convert_models import hf_logits, make_model, save_checkpoint, tokens_for_test

    model = make_model(case)
    folder = save_checkpoint(model, tmp_path / "hf")
    out = tmp_path / "m.gguf"
    convert(folder, out, out_type, progress=False)
    tokens = tokens_for_test(64)
    llm = _llama_cpp_model(out, logits_all=True)
    llm.eval(tokens)
    theirs = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    ours = _core.Model(str(out), n_threads=1).eval(tokens)
    # Both engines read the same stored weights and keep the KV cache in f16; their summation
    # orders and activation rounding differ. f32: a few 1e-3 of the largest logit (the bound
    # of test_convert_models.F32_REL); q4_k_m: both quantize activations to 8 bits, 2.5e-2.
    rel = 4e-3 if out_type == "f32" else 2.5e-2
    assert np.abs(ours - theirs).max() < rel * np.abs(theirs).max()
    if out_type == "f32":
        ref = hf_logits(model, tokens)
        assert np.abs(theirs - ref).max() < rel * np.abs(ref).max()
