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
    out = convert(folder / "ckpt", folder / "text.gguf", "f32", progress=False,
                  mmproj_out=folder / "mmproj.gguf")
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
        convert(folder, tmp_path / "t.gguf", "f32", progress=False, mmproj_out=tmp_path / "m.gguf")
    assert not (tmp_path / "t.gguf").exists()


# --- the vision tower -------------------------------------------------------------------------

# The tower's weights are f32 here, as are its activations; what it rounds is the attention's K/V,
# stored as f16 (half an f16 ulp, 2^-11 relative, as the language model's cache). Through two
# blocks and the merger that moves outputs of magnitude ~2.4 by at most 4.2e-4 (measured on the
# three shapes below: 1.2e-4 to 1.7e-4 of the largest output), while a patch out of order, a
# window too wide or narrow, or a RoPE pair turned by the wrong axis moves them by O(1). 1e-3 of
# the largest output leaves ~6x room on one side and ~1000x on the other.
TOWER_REL = 1e-3

# (height, width): square; 3x4 merged tokens (windows of one token in a grid of odd height);
# 2x5 (a wide one).
TOWER_SHAPES = [(56, 56), (84, 112), (56, 140)]


def hf_tower(model, pixels: np.ndarray) -> np.ndarray:
    from qwen25vl_support import hf_pixel_values

    values, grid = hf_pixel_values(pixels)
    with torch.no_grad():
        return model.model.visual(values, grid_thw=grid).pooler_output.numpy()


@pytest.mark.parametrize("shape", TOWER_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_vision_tower_matches_transformers(qwen25vl, shape) -> None:
    model, _, mmproj = qwen25vl
    vision = _core.VisionModel(str(mmproj), "cpu", 2)
    height, width = shape
    assert vision.preprocessed_size(width, height) == [width, height]
    assert vision.n_tokens(width, height) == (width // 28) * (height // 28)
    pixels = np.random.default_rng(1).standard_normal((3, height, width)).astype(np.float32)
    ours, ref = vision.encode(pixels), hf_tower(model, pixels)
    assert ours.shape == ref.shape == (vision.n_tokens(width, height), 64)
    assert np.abs(ours - ref).max() < TOWER_REL * np.abs(ref).max()


def test_window_attention_is_not_full_attention(qwen25vl) -> None:
    """The bound above can tell the windowed block from a full one: the same checkpoint with
    every block full (fullatt_block_indexes [0, 1]) moves the outputs by far more than it."""
    model, _, _ = qwen25vl
    pixels = np.random.default_rng(1).standard_normal((3, 56, 56)).astype(np.float32)
    windowed = hf_tower(model, pixels)
    model.model.visual.fullatt_block_indexes = [0, 1]
    try:
        full = hf_tower(model, pixels)
    finally:
        model.model.visual.fullatt_block_indexes = [1]
    assert np.abs(full - windowed).max() > 30 * TOWER_REL * np.abs(windowed).max()


def test_smart_resize_is_transformers(qwen25vl) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    _, _, mmproj = qwen25vl
    vision = _core.VisionModel(str(mmproj), "cpu", 1)
    # The file's limits: min_pixels 4 and max_pixels 64 merged tokens (preprocessor_config.json).
    for width, height in [(56, 56), (70, 42), (13, 200), (640, 480), (30, 30), (1, 150), (98, 14)]:
        h, w = smart_resize(height, width, factor=28, min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
        assert vision.preprocessed_size(width, height) == [w, h], (width, height)


def test_preprocessing_is_transformers_processor(qwen25vl) -> None:
    """ember.vision.preprocess against Qwen2VLImageProcessor (its Pillow path) on an image it
    resizes: same size; values within one 8-bit level of the resize (both filter in PIL's
    bicubic way; PIL in fixed point), i.e. 1/255/std ~ 0.015 after normalization."""
    from qwen25vl_support import IMAGE_MEAN, IMAGE_STD, hf_pixel_values
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from ember.vision import preprocess

    _, _, mmproj = qwen25vl
    vision = _core.VisionModel(str(mmproj), "cpu", 1)
    image = np.random.default_rng(2).integers(0, 256, (75, 130, 3), dtype=np.uint8)
    ours = preprocess(image, vision)
    processor = Qwen2VLImageProcessorPil(image_mean=IMAGE_MEAN, image_std=IMAGE_STD, min_pixels=4 * 28 * 28,
                                         max_pixels=64 * 28 * 28)
    out = processor(images=[image], return_tensors="pt")
    assert ours.shape == (3, 84, 140)
    assert out["image_grid_thw"].tolist() == [[1, 6, 10]]
    mine, _ = hf_pixel_values(ours)
    diff = np.abs(mine.numpy() - out["pixel_values"].numpy())
    assert diff.max() <= 1.01 / 255 / min(IMAGE_STD)
    assert diff.mean() < 0.1 / 255 / min(IMAGE_STD)  # mostly exact


def test_mrope_positions_are_transformers_rope_index(qwen25vl) -> None:
    """Two images (2x2 and 3x4 merged tokens) between text: the positions the language model's
    M-RoPE needs, as transformers' get_rope_index computes them."""
    from qwen25vl_support import IMAGE_PAD, VISION_END, VISION_START

    from ember.vision_qwen25vl import mrope_positions

    model, _, _ = qwen25vl
    grids = [(2, 2), (3, 4)]
    tokens = [5, 6, VISION_START, *[IMAGE_PAD] * 4, VISION_END, 7, VISION_START, *[IMAGE_PAD] * 12,
              VISION_END, 8, 9]
    types = torch.tensor([[1 if t == IMAGE_PAD else 0 for t in tokens]])
    ref, deltas = model.model.get_rope_index(torch.tensor([tokens]), types,
                                             image_grid_thw=torch.tensor([[1, 4, 4], [1, 6, 8]]))
    ours = mrope_positions(tokens, IMAGE_PAD, grids)
    np.testing.assert_array_equal(ours, ref[:, 0].numpy())
    assert ours.max() + 1 - len(tokens) == int(deltas[0, 0])
    with pytest.raises(ValueError, match="3 image grids for 2 image runs"):
        mrope_positions(tokens, IMAGE_PAD, [*grids, (1, 1)])
    with pytest.raises(ValueError, match="expected 16 image tokens"):
        mrope_positions(tokens, IMAGE_PAD, [(2, 2), (4, 4)])
