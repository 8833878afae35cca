"""SmolLM3's NoPE layers and Phi-3's LongRoPE against transformers: tiny random checkpoints,
converted by ember.convert (f32 and f16), run by ember's Model.

LongRoPE picks its short or long frequency divisors by context, as llama.cpp does: a Model (or an
engine) whose n_ctx is past the original context rotates every position with the long ones, else
with the short ones, for the cache's whole life. transformers picks by the largest position of
each call, so one call over a prompt within the original context uses the short divisors, one
over a longer prompt the long ones for every position. The comparisons below are the cases where
the two rules meet: n_ctx 32 (the original context) against a prompt of at most 32 tokens, n_ctx
100 against transformers' 100-token call — whose first rows, by causality, are also what a
long-context ember computes for a shorter prompt."""

from __future__ import annotations

import copy
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from checkpoints import (
    F32_REL,
    LONG,
    NOPE_FLAGS,
    ORIGINAL_CTX,
    SHORT,
    make_phi3_longrope,
    make_smollm3,
    save_checkpoint,
    tokens_for_test,
)
from engine_support import reference_greedy, run_all, tokens_of
from tiny_models import hf_logits

from ember import _core
from ember.convert import ConvertError, convert


def rounded(model, dtype: torch.dtype):
    """`model` with its weights rounded to `dtype` (what an f16 file stores); buffers stay f32."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    return twin


def metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def assert_close(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < F32_REL * np.abs(ref).max()


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory: pytest.TempPathFactory):
    model = make_smollm3()
    return model, save_checkpoint(model, tmp_path_factory.mktemp("smollm3"))


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory):
    model = make_phi3_longrope()
    return model, save_checkpoint(model, tmp_path_factory.mktemp("phi3-longrope"))


@pytest.mark.parametrize("out_type", ["f32", "f16"])
def test_smollm3_nope_layers(out_type: str, smollm3, tmp_path: Path) -> None:
    model, folder = smollm3
    out = convert(folder, tmp_path / "m.gguf", out_type, progress=False)
    assert out.architecture == "smollm3"
    meta = metadata(out.path)
    assert meta["smollm3.attention.rope_pattern"] == [bool(f) for f in NOPE_FLAGS]
    ember_model = _core.Model(str(out.path), n_threads=1)
    assert ember_model.architecture == "smollm3"
    tokens = tokens_for_test()
    ours = ember_model.eval(tokens)
    ref = hf_logits(rounded(model, torch.float16) if out_type == "f16" else model, tokens)
    assert_close(ours, ref)
    # The pattern matters: with every layer rotating, transformers' logits leave the tolerance.
    rotating = copy.deepcopy(model)
    for layer in rotating.model.layers:
        layer.self_attn.use_rope = True
    assert np.abs(hf_logits(rotating, tokens) - ref).max() > 10 * F32_REL * np.abs(ref).max()


@pytest.mark.parametrize("out_type", ["f32", "f16"])
def test_phi3_longrope_short_and_long(out_type: str, phi3, tmp_path: Path) -> None:
    model, folder = phi3
    out = convert(folder, tmp_path / "m.gguf", out_type, progress=False).path
    meta = metadata(out)
    assert meta["phi3.rope.scaling.original_context_length"] == ORIGINAL_CTX
    assert meta["phi3.rope.scaling.attn_factor"] == pytest.approx(
        np.sqrt(1 + np.log(4) / np.log(ORIGINAL_CTX)))
    assert meta["phi3.rope.dimension_count"] == 12
    assert "phi3.rope.scaling.type" not in meta  # as llama.cpp writes it
    tensors = {t.name: np.array(t.data) for t in gguf.GGUFReader(out).tensors}
    np.testing.assert_array_equal(tensors["rope_factors_short.weight"], np.float32(SHORT))
    np.testing.assert_array_equal(tensors["rope_factors_long.weight"], np.float32(LONG))

    ref_model = rounded(model, torch.float16) if out_type == "f16" else model
    tokens = tokens_for_test(100)
    ref_long = hf_logits(ref_model, tokens)  # 100 > 32 positions: the long divisors throughout
    ref_short = hf_logits(ref_model, tokens[:ORIGINAL_CTX])
    short_ctx = _core.Model(str(out), n_threads=1, n_ctx=ORIGINAL_CTX)
    long_ctx = _core.Model(str(out), n_threads=1, n_ctx=100)
    assert_close(short_ctx.eval(tokens[:ORIGINAL_CTX]), ref_short)
    assert_close(long_ctx.eval(tokens), ref_long)
    # A long context rotates a short prompt with the long divisors too (per context, not per call).
    assert_close(long_ctx.eval(tokens[:20]), ref_long[:20])
    # The two sets differ far beyond the tolerance, so each comparison tells them apart.
    assert np.abs(ref_long[:ORIGINAL_CTX] - ref_short).max() > 10 * F32_REL * np.abs(ref_short).max()


def test_engine_picks_longrope_factors_by_its_context(phi3, tmp_path: Path) -> None:
    """The engine's runner chooses like a Model of the same n_ctx: its greedy text equals the
    single-sequence loop's at n_ctx 32 (short factors) and at 100 (long), and the two differ."""
    _, folder = phi3
    path = str(convert(folder, tmp_path / "m.gguf", "f32", progress=False).path)
    prompt = tokens_for_test(16, seed=2)
    greedy = {}
    for n_ctx in (ORIGINAL_CTX, 100):
        engine = _core.Engine(path, n_threads=1, parallel=1, n_ctx=n_ctx, kv_size=128, block_size=4)
        greedy[n_ctx] = tokens_of(run_all(engine, [prompt], 12)[0])
        assert greedy[n_ctx] == reference_greedy(_core.Model(path, n_threads=1, n_ctx=n_ctx), prompt, 12)
    assert greedy[ORIGINAL_CTX] != greedy[100]


def _edit_config(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of checkpoint `folder` whose config.json `edit` changed (in place)."""
    import json
    import shutil

    copy_dir = tmp_path / f"{folder.name}-{edit.__name__}"
    shutil.copytree(folder, copy_dir)
    config = json.loads((copy_dir / "config.json").read_text())
    edit(config)
    (copy_dir / "config.json").write_text(json.dumps(config))
    return copy_dir


def test_bad_nope_and_longrope_configs_are_refused(smollm3, phi3, tmp_path: Path) -> None:
    def short_long_factor(config: dict) -> None:
        config["rope_parameters"]["long_factor"] = LONG[:-1]

    def short_flags(config: dict) -> None:
        config["no_rope_layers"] = NOPE_FLAGS[:-1]

    def sliding(config: dict) -> None:
        config["use_sliding_window"], config["sliding_window"] = True, 16

    cases = [(phi3, short_long_factor, "long_factor is .* expected 6 positive numbers"),
             (smollm3, short_flags, "no_rope_layers is .* expected 4 flags"),
             (smollm3, sliding, "use_sliding_window is true")]
    for (_, folder), edit, message in cases:
        with pytest.raises(ConvertError, match=message):
            convert(_edit_config(folder, tmp_path, edit), tmp_path / "o.gguf", "f32", progress=False)


def test_a_file_with_one_longrope_factor_set_is_refused(phi3, tmp_path: Path) -> None:
    """ember's loader: LongRoPE needs both factor tensors (a file with only the long ones would
    otherwise rotate short contexts unscaled)."""
    _, folder = phi3
    reader = gguf.GGUFReader(convert(folder, tmp_path / "m.gguf", "f32", progress=False).path)
    w = gguf.GGUFWriter(str(tmp_path / "long-only.gguf"), "phi3")
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment"):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    for t in reader.tensors:
        if t.name != "rope_factors_short.weight":
            w.add_tensor(t.name, np.asarray(t.data, np.float32).reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(_core.GGUFError, match="rope_factors_short.weight.*LongRoPE needs both"):
        _core.Model(str(tmp_path / "long-only.gguf"), n_threads=1)
