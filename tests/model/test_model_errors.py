"""Bad models and bad inputs fail with messages that name the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_models

from ember import _core


@pytest.fixture(scope="module")
def hf_llama():
    return tiny_models.make_model("llama")


def _write(hf, tmp_path: Path, **kwargs) -> str:
    return str(tiny_models.write_gguf(hf, tmp_path / "bad.gguf", "llama", **kwargs))


def test_unsupported_architecture_lists_supported(hf_llama, tmp_path: Path) -> None:
    path = _write(hf_llama, tmp_path, file_arch="gpt2")
    supported = r"llama, qwen2, qwen3, phi3, gemma3, gemma2, bert"
    with pytest.raises(NotImplementedError, match=r"'gpt2' is not supported.*" + supported):
        _core.Model(path)


def test_wrong_shape_names_tensor_expected_and_got(hf_llama, tmp_path: Path) -> None:
    def edit(name, a):
        return a[:16] if name == "blk.1.attn_k.weight" else a

    expected = r"'blk\.1\.attn_k\.weight': expected shape \[64, 32\], got \[64, 16\]"
    with pytest.raises(ValueError, match=expected):
        _core.Model(_write(hf_llama, tmp_path, edit=edit))


def test_missing_tensor_is_named(hf_llama, tmp_path: Path) -> None:
    def edit(name, a):
        return None if name == "blk.0.ffn_up.weight" else a

    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_up\.weight': missing"):
        _core.Model(_write(hf_llama, tmp_path, edit=edit))


def test_wrong_norm_type_is_named(hf_llama, tmp_path: Path) -> None:
    def edit(name, a):
        return a.astype(np.float16) if name == "output_norm.weight" else a

    with pytest.raises(ValueError, match=r"'output_norm\.weight': expected type f32, got f16"):
        _core.Model(_write(hf_llama, tmp_path, edit=edit))


def test_inputs_are_checked(hf_llama, tmp_path: Path) -> None:
    model = _core.Model(_write(hf_llama, tmp_path), n_ctx=16)
    assert model.n_ctx == 16 and model.n_ctx_train == 512
    with pytest.raises(ValueError, match=r"20 tokens .* exceed the context size n_ctx = 16"):
        model.eval(list(range(20)))
    model.eval(list(range(10)))
    with pytest.raises(ValueError, match=r"17 tokens \(10 cached \+ 7 new\).*n_ctx = 16"):
        model.eval(list(range(7)), reset=False)
    assert model.n_past == 10  # a refused call changes nothing
    with pytest.raises(ValueError, match=r"id 256, outside the vocabulary \[0, 256\)"):
        model.eval([1, 256])
    with pytest.raises(ValueError, match="at least one token"):
        model.eval([])
