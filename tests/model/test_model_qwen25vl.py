"""Qwen2.5-VL against transformers on a tiny random checkpoint (tests/qwen25vl_support.py),
converted by ember.convert to a text GGUF (architecture qwen2vl) and an mmproj (clip,
qwen2.5vl_merger).

llama.cpp reads both files as written here (checked by hand with the peer build: llama-simple
runs the text file, "mrope sections = [2, 3, 3, 0]"; llama-server -m TEXT --mmproj MMPROJ loads
the projector and answers /health), so the layout tests below pin what it read.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from checkpoints import F32_REL
from qwen25vl_support import make_qwen25vl, save_qwen25vl

from ember import _core
from ember.convert import ConvertError, convert


@pytest.fixture(scope="module")
def qwen25vl(tmp_path_factory: pytest.TempPathFactory):
    """(transformers model, text GGUF f32, mmproj GGUF f32)."""
    folder = tmp_path_factory.mktemp("qwen25vl")
    model = make_qwen25vl()
    save_qwen25vl(model, folder / "ckpt")
    out = convert(folder / "ckpt", folder / "text.gguf", "f32", progress=False, mmproj=folder / "mmproj.gguf")
    return model, out.path, out.mmproj


def metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def test_text_file_is_qwen2vl_with_mrope_sections(qwen25vl) -> None:
    _, text, _ = qwen25vl
    meta = metadata(text)
    assert meta["general.architecture"] == "qwen2vl"
    assert meta["qwen2vl.rope.dimension_sections"] == [2, 3, 3, 0]
    assert meta["qwen2vl.rope.dimension_count"] == 16
    names = {t.name for t in gguf.GGUFReader(text).tensors}
    assert not any(n.startswith(("v.", "mm.")) for n in names)  # the tower is the mmproj's


def test_text_logits_match_transformers(qwen25vl) -> None:
    """Text alone: all three M-RoPE positions equal the token's, which is plain NeoX RoPE."""
    model, text, _ = qwen25vl
    ember_model = _core.Model(str(text), n_threads=2)
    assert ember_model.architecture == "qwen2vl"
    tokens = np.random.default_rng(0).integers(3, 500, 60).tolist()
    ours = ember_model.eval(tokens)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([tokens])).logits[0].numpy()
    assert ours.shape == ref.shape == (60, 512)
    assert np.abs(ours - ref).max() < F32_REL * np.abs(ref).max()


def test_mmproj_layout_is_llama_cpp_clip(qwen25vl) -> None:
    model, _, mmproj = qwen25vl
    meta = metadata(mmproj)
    assert meta["general.architecture"] == "clip"
    assert meta["general.type"] == "mmproj"
    assert meta["clip.projector_type"] == "qwen2.5vl_merger"
    assert meta["clip.has_vision_encoder"] is True
    assert meta["clip.use_silu"] is True
    assert (meta["clip.vision.projection_dim"], meta["clip.vision.embedding_length"],
            meta["clip.vision.feed_forward_length"], meta["clip.vision.block_count"],
            meta["clip.vision.attention.head_count"],
            meta["clip.vision.patch_size"]) == (64, 32, 48, 2, 2, 14)
    assert meta["clip.vision.n_wa_pattern"] == 2  # fullatt_block_indexes [1]
    assert meta["clip.vision.window_size"] == 28
    assert np.allclose(meta["clip.vision.image_mean"], [0.48145466, 0.4578275, 0.40821073])
    tensors = {t.name: t for t in gguf.GGUFReader(mmproj).tensors}
    state = model.state_dict()
    conv = state["model.visual.patch_embed.proj.weight"].numpy()
    np.testing.assert_array_equal(tensors["v.patch_embd.weight"].data, conv[:, :, 0])
    np.testing.assert_array_equal(tensors["v.patch_embd.weight.1"].data, conv[:, :, 1])
    qkv = state["model.visual.blocks.1.attn.qkv.weight"].numpy()
    for j, proj in enumerate("qkv"):
        np.testing.assert_array_equal(tensors[f"v.blk.1.attn_{proj}.weight"].data,
                                      qkv[32 * j:32 * (j + 1)])
    np.testing.assert_array_equal(tensors["mm.2.weight"].data,
                                  state["model.visual.merger.mlp.2.weight"].numpy())
    assert len(tensors) == 2 + 2 * 16 + 5


def test_mmproj_asked_of_a_text_only_model_is_refused(tmp_path: Path) -> None:
    from checkpoints import save_checkpoint
    from tiny_models import make_model

    folder = save_checkpoint(make_model("qwen2", vocab_size=512), tmp_path / "ckpt")
    with pytest.raises(ConvertError, match="no vision tower"):
        convert(folder, tmp_path / "t.gguf", "f32", progress=False, mmproj=tmp_path / "m.gguf")
    assert not (tmp_path / "t.gguf").exists()
