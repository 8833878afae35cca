"""Gemma 3 with vision on a tiny random Gemma3ForConditionalGeneration (tests/vision_support.py),
converted by ember convert into the text GGUF and the mmproj, against transformers: the mmproj's
layout (llama.cpp's clip keys and tensor names), the preprocessing against Gemma3ImageProcessor,
the SigLIP tower + projector output, the first token's log-probabilities of a prompt with an image
(Gemma 3's image tokens attending both ways within the image, as transformers masks them), image
embeddings encoded once per content and the prefix cache keyed by the image, and the Vulkan
backend's embeddings against the CPU's.

Tolerances, with f32 weights throughout (convert --type f32), so that what is left is ember's own
rounding: the f16 K/V rows (the tower's attention runs over an f16 KV view, the language model's
cache is f16) round each key and value by up to 2^-11 relatively; two vision and two text layers
deep that measured 5e-5 RMS on the embeddings and 2e-4 on the log-probabilities. The bounds (1e-3
relative RMS, 0.01 absolute on log-probabilities) leave 5-20x room, while a wrong norm, pooling
order, transpose or mask moves them by O(0.1-1): causal attention over the image's tokens moves
the log-probabilities by ~0.2, which the test checks it tells apart."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from vision_support import IMAGE, make_gemma3_vision, sample_image, save_gemma3_vision

from ember import _core, vision
from ember.convert import convert
from ember.engine import Engine
from ember.llm import LLM
from ember.media import MEDIA_MARKER
from ember.sampling import SamplingParams

EMBED_REL_RMS = 1e-3
LOGPROB_ABS = 0.01

# llama.cpp's mtmd on the same files (convert --type f16 of this checkpoint, the mmproj beside
# it), from llama-server --mmproj (LLAMA_MEDIA_MARKER='<__media__>') /completion with
# {"prompt_string": PROMPT, "multimodal_data": [PNG of sample_image()]}, n_probs 5, cache_prompt
# off: the five most likely first tokens and their log-probabilities. Both engines keep f16
# weights and an f16 KV cache and accumulate in f32; they differ in summation order and llama.cpp
# rounds activations to f16 in places: measured within 0.002, bound 0.01.
LLAMA_CPP_TOP5 = {
    f"Hello {MEDIA_MARKER} world": [(17, -3.2882), (341, -3.6921), (181, -3.7125), (348, -4.0169),
                                    (29, -4.1238)],
    MEDIA_MARKER: [(513, -2.7614), (127, -3.4796), (483, -3.9676), (406, -4.0909), (95, -4.1961)],
}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """(transformers model, text GGUF, mmproj GGUF)."""
    folder = tmp_path_factory.mktemp("gemma3-vision")
    model = make_gemma3_vision()
    save_gemma3_vision(model, folder / "hf")
    result = convert(folder / "hf", folder / "tiny.gguf", "f32", progress=False)
    assert result.mmproj == folder / "mmproj-tiny.gguf"
    return model, result.path, result.mmproj


@pytest.fixture(scope="module")
def engine(gemma3):
    _, text, mmproj = gemma3
    with Engine(text, mmproj=mmproj, device="cpu", n_threads=2, n_ctx=256, parallel=2) as e:
        yield e


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def test_mmproj_has_llama_cpps_clip_layout(gemma3) -> None:
    import gguf
    _, _, mmproj = gemma3
    r = gguf.GGUFReader(mmproj)

    def value(key):
        field = r.fields[key]
        return field.contents()

    assert value("general.architecture") == "clip"
    assert value("clip.projector_type") == "gemma3"
    assert value("clip.has_vision_encoder") is True
    assert (value("clip.vision.image_size"), value("clip.vision.patch_size")) == (64, 8)
    assert value("clip.vision.projection_dim") == 64
    assert value("clip.vision.projector.scale_factor") == 2  # 8 patches a side -> 4 tokens
    names = {t.name for t in r.tensors}
    assert {"v.patch_embd.weight", "v.position_embd.weight", "v.blk.1.attn_q.weight",
            "v.blk.1.ffn_down.bias", "v.post_ln.weight", "mm.input_projection.weight",
            "mm.soft_emb_norm.weight"} <= names
    assert not any(n.startswith("blk.") or "head" in n for n in names)


def test_preprocessing_matches_gemma3_image_processor(gemma3) -> None:
    """Within one uint8 level (2/255 after the std of 0.5): PIL's resampler works in fixed point,
    ours in float64, and the two round a few pixels to neighbouring levels."""
    from transformers import Gemma3ImageProcessorPil
    _, _, mmproj = gemma3
    projector = _core.VisionModel(str(mmproj))
    processor = Gemma3ImageProcessorPil(size={"height": 64, "width": 64},
                                        image_mean=[0.5] * 3, image_std=[0.5] * 3)
    for size in [(64, 64), (80, 100), (300, 200)]:
        image = sample_image(1, size)
        ours = vision.preprocess(image, projector)
        theirs = processor(images=image, return_tensors="np")["pixel_values"][0]
        assert ours.shape == theirs.shape == (3, 64, 64)
        assert np.abs(ours - theirs).max() <= 2 / 255 + 1e-6, size


def test_tower_and_projector_match_transformers(gemma3) -> None:
    model, _, mmproj = gemma3
    projector = _core.VisionModel(str(mmproj), "cpu", 2)
    pixels = vision.preprocess(sample_image(), projector)
    ours = projector.encode(pixels)
    with torch.no_grad():
        theirs = model.model.get_image_features(torch.from_numpy(pixels)[None],
                                                return_dict=True).pooler_output[0].numpy()
    assert ours.shape == theirs.shape == (16, 64)
    assert rel_rms(ours, theirs) < EMBED_REL_RMS


def test_first_token_logprobs_match_transformers(gemma3, engine) -> None:
    model, _, _ = gemma3
    image = sample_image()
    tokens = engine.tokenize_images(f"Hello {MEDIA_MARKER} world", [image])
    n_image = tokens.count(IMAGE)
    assert n_image == 16 and tokens[tokens.index(IMAGE) - 1] == IMAGE - 2  # <start_of_image>
    result = engine.submit(tokens, SamplingParams(max_tokens=1, temperature=0, logprobs=True,
                                                  top_logprobs=20), images=[image]).result()
    assert result.usage.prompt_tokens == len(tokens)  # image tokens counted
    ours = {t.token: t.logprob for t in result.logprobs[0].top}
    pixels = torch.from_numpy(vision.preprocess(image, engine._core.vision_model))[None]
    ids = torch.tensor([tokens])
    with torch.no_grad():
        both_ways = model(input_ids=ids, pixel_values=pixels,
                          token_type_ids=(ids == IMAGE).long()).logits[0, -1]
        causal = model(input_ids=ids, pixel_values=pixels).logits[0, -1]
    both_ways, causal = (torch.log_softmax(x, -1).numpy() for x in (both_ways, causal))
    top = list(ours)
    assert top[0] == int(both_ways.argmax())
    got = np.array([ours[t] for t in top])
    assert np.abs(got - both_ways[top]).max() < LOGPROB_ABS
    assert np.abs(got - causal[top]).max() > 5 * LOGPROB_ABS  # the mask is what it checks


def test_a_repeated_image_is_encoded_once_and_served_from_the_prefix_cache(engine) -> None:
    image, other = sample_image(5), sample_image(6)
    prompt = f"A picture: {MEDIA_MARKER} What is it?"
    tokens = engine.tokenize_images(prompt, [image])
    start = tokens.index(IMAGE)
    params = SamplingParams(max_tokens=4, temperature=0)
    before = engine.stats().images_encoded
    first = engine.submit(tokens, params, images=[image]).result()
    assert engine.stats().images_encoded == before + 1
    again = engine.submit(tokens, params, images=[image]).result()
    assert engine.stats().images_encoded == before + 1  # not encoded again
    assert again.usage.cached_tokens > start + 16 and again.tokens == first.tokens
    # Another image in the same text: its positions miss the cache (keyed by content).
    third = engine.submit(tokens, params, images=[other]).result()
    assert engine.stats().images_encoded == before + 2
    assert third.usage.cached_tokens <= start
    # Twice in one prompt: one encode.
    two = engine.tokenize_images(f"{MEDIA_MARKER} and {MEDIA_MARKER}", [image, image])
    engine.submit(two, params, images=[image, image]).result()
    assert engine.stats().images_encoded == before + 2


def test_bad_image_requests_are_value_errors(gemma3, engine) -> None:
    image = sample_image()
    with pytest.raises(ValueError, match="2 image markers but 1 images"):
        engine.tokenize_images(f"{MEDIA_MARKER}{MEDIA_MARKER}", [image])
    tokens = engine.tokenize_images(f"x {MEDIA_MARKER}", [image])
    with pytest.raises(ValueError, match="needs a run of 16 image tokens"):
        engine.submit(tokens[:-5], SamplingParams(max_tokens=1), images=[image])
    with pytest.raises(ValueError, match="uint8"):
        engine.submit(tokens, SamplingParams(max_tokens=1), images=[image.astype(np.float32)])
    _, text, _ = gemma3
    llm = LLM(text, n_threads=1, n_ctx=64, parallel=1, device="cpu")
    assert not llm.engine.vision
    with pytest.raises(ValueError, match="no vision projector"):
        llm.engine.tokenize_images(MEDIA_MARKER, [image])


def test_llm_takes_mmproj(gemma3) -> None:
    _, text, mmproj = gemma3
    llm = LLM(text, mmproj=mmproj, n_threads=1, n_ctx=64, parallel=1, device="cpu")
    assert llm.engine.vision
    assert llm.engine._core.vision_model.projector_type == "gemma3"


def vulkan_device() -> str | None:
    devices, _ = _core.devices()
    usable = [d["device"] for d in devices if d["backend"] == "vulkan" and d["usable"]]
    return usable[0] if usable else None


def test_f16_files_match_llama_cpps_mtmd(gemma3, tmp_path) -> None:
    import gguf
    folder = gemma3[1].parent / "hf"
    result = convert(folder, tmp_path / "f16.gguf", "f16", progress=False)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(result.mmproj).tensors}
    # The tensor types llama.cpp's --mmproj writes: embeddings f32, the projection f16.
    f32, f16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16
    assert types["v.patch_embd.weight"] == types["v.position_embd.weight"] == f32
    assert types["mm.input_projection.weight"] == types["v.blk.0.attn_q.weight"] == f16
    image = sample_image()
    with Engine(result.path, mmproj=result.mmproj, device="cpu", n_threads=2, n_ctx=128,
                parallel=1) as e:
        for prompt, expected in LLAMA_CPP_TOP5.items():
            tokens = e.tokenize_images(prompt, [image])
            got = e.submit(tokens, SamplingParams(max_tokens=1, temperature=0, logprobs=True,
                                                  top_logprobs=5), images=[image]).result()
            top = [(t.token, t.logprob) for t in got.logprobs[0].top]
            assert [t for t, _ in top] == [t for t, _ in expected], prompt
            assert np.abs(np.array([lp for _, lp in top]) -
                          np.array([lp for _, lp in expected])).max() < LOGPROB_ABS, prompt


def test_vulkan_embeddings_match_the_cpu(gemma3) -> None:
    """Both backends run the same f32 ops in different orders (the CPU's blocked kernels, the
    device's workgroup reductions): f32 sums of a few dozen terms agree to ~1e-6 relatively, and
    the f16 K/V rounding is the same on both; bound 1e-4 relative RMS."""
    device = vulkan_device()
    if device is None:
        if os.environ.get("EMBER_REQUIRE_VULKAN") == "1":
            pytest.fail("EMBER_REQUIRE_VULKAN=1 but no usable Vulkan device")
        pytest.skip("no Vulkan device")
    _, text, mmproj = gemma3
    cpu = _core.VisionModel(str(mmproj), "cpu", 2)
    gpu = _core.VisionModel(str(mmproj), device)
    pixels = vision.preprocess(sample_image(), cpu)
    assert rel_rms(gpu.encode(pixels), cpu.encode(pixels)) < 1e-4
    # The whole path on the device: the same greedy tokens as the CPU engine.
    image = sample_image(3)
    outs = []
    for dev in ("cpu", device):
        with Engine(text, mmproj=mmproj, device=dev, n_threads=2, n_ctx=128, parallel=1) as e:
            tokens = e.tokenize_images(f"Look: {MEDIA_MARKER}", [image])
            outs.append(e.submit(tokens, SamplingParams(max_tokens=6, temperature=0),
                                 images=[image]).result().tokens)
    assert outs[0] == outs[1]



def test_chunked_prefill_and_prefix_hits_over_an_image_give_the_same_logprobs(gemma3) -> None:
    """The prompt run whole; then behind a prefix hit that covers the image (its cached rows
    reused, another text after it); then in steps of 20 tokens (the chunk before the image ends
    at its start, the image runs whole in the next): the first token's log-probabilities agree
    within float rounding of the different chunking."""
    _, text, mmproj = gemma3
    image = sample_image(7)
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
    prompt = f"one two {MEDIA_MARKER} three four five"

    def top(e: Engine, prompt: str) -> tuple[list[tuple[int, float]], int]:
        tokens = e.tokenize_images(prompt, [image])
        got = e.submit(tokens, params, images=[image]).result()
        return [(t.token, t.logprob) for t in got.logprobs[0].top], got.usage.cached_tokens

    runs = []
    for kw in ({}, {}, {"max_batch_tokens": 20}):
        with Engine(text, mmproj=mmproj, device="cpu", n_threads=2, n_ctx=128, parallel=1,
                    **kw) as e:
            if len(runs) == 1:
                top(e, f"one two {MEDIA_MARKER} six")
            got, cached = top(e, prompt)
            if len(runs) == 1:
                tokens = e.tokenize_images(prompt, [image])
                assert cached > tokens.index(IMAGE) + 16  # the image's rows came from the cache
            runs.append(got)
    whole = runs[0]
    for other in runs[1:]:
        assert [t for t, _ in other] == [t for t, _ in whole]
        assert np.abs(np.array([lp for _, lp in other]) -
                      np.array([lp for _, lp in whole])).max() < 1e-3


def test_cli_convert_writes_the_mmproj_where_asked(gemma3, tmp_path) -> None:
    import subprocess
    import sys
    folder = gemma3[1].parent / "hf"
    out, mmproj = tmp_path / "m.gguf", tmp_path / "vision" / "proj.gguf"
    mmproj.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "ember.cli", "convert", str(folder), "-o", str(out),
                        "--mmproj-out", str(mmproj)], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert f"wrote {mmproj}" in r.stderr
    assert _core.VisionModel(str(mmproj)).projector_type == "gemma3"
    assert not (tmp_path / "mmproj-m.gguf").exists()
    r = subprocess.run([sys.executable, "-m", "ember.cli", "convert", str(folder), "-o", str(out),
                        "--mmproj-out", str(mmproj)], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode != 0 and "already exists" in r.stderr  # the model, then the mmproj
