"""ember.images: image files decoded to RGB pixels (against Pillow's own decoding of files made
here), the limits and sources, images placed in chat messages and rendered as markers, and
ember.LLM's images= on a model without vision (the clear ValueError)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ember.chat.template import ChatTemplate
from ember.images import (
    LOCAL,
    ImageError,
    ImagePolicy,
    ImageRef,
    decode,
    load,
    read_bytes,
    refs_in,
    with_images,
)
from ember.llm import LLM
from ember.media import MEDIA_MARKER

RNG = np.random.default_rng(7)
PIXELS = RNG.integers(0, 256, (6, 9, 3), dtype=np.uint8)


def encoded(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


@pytest.mark.parametrize("fmt, kwargs", [("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}),
                                         ("JPEG", {"quality": 95}), ("GIF", {})])
def test_formats_decode_to_rgb_uint8(fmt: str, kwargs: dict[str, Any]) -> None:
    data = encoded(Image.fromarray(PIXELS), fmt, **kwargs)
    pixels = decode(data)
    assert pixels.shape == (6, 9, 3) and pixels.dtype == np.uint8
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(pixels, expected)
    if fmt in ("PNG", "BMP", "WEBP"):  # lossless
        np.testing.assert_array_equal(pixels, PIXELS)


def test_gif_first_frame_alpha_on_white_exif_and_16_bit() -> None:
    frames = [Image.fromarray(np.full((4, 4, 3), v, np.uint8)) for v in (10, 200)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    assert decode(gif.getvalue())[0, 0].tolist() == [10, 10, 10]
    rgba = np.zeros((3, 3, 4), np.uint8)
    rgba[..., 0] = 255
    rgba[0, 0, 3] = 255          # opaque red
    rgba[1, 1, 3] = 128          # half-transparent red over white
    out = decode(encoded(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert out[0, 0].tolist() == [255, 0, 0] and out[2, 2].tolist() == [255, 255, 255]
    assert out[1, 1].tolist() == [255, 127, 127]
    # EXIF orientation 6 (rotate 90° clockwise to view): 2x6 stored, 6x2 shown.
    image = Image.fromarray(RNG.integers(0, 256, (2, 6, 3), dtype=np.uint8))
    exif = image.getexif()
    exif[0x0112] = 6
    assert decode(encoded(image, "JPEG", exif=exif)).shape == (6, 2, 3)
    grey16 = Image.fromarray(np.array([[0, 257 * 100], [65535, 257]], np.uint16))
    assert decode(encoded(grey16, "PNG"))[..., 0].tolist() == [[0, 100], [255, 1]]


def test_bad_images() -> None:
    png = encoded(Image.fromarray(PIXELS), "PNG")
    cases = {
        png[:len(png) // 2]: "truncated",
        encoded(Image.new("RGB", (1, 1)), "PNG"): "1x1 pixels",
        encoded(Image.new("RGB", (1, 40)), "PNG"): "each side must have at least 2",
        encoded(Image.new("1", (20000, 20000)), "PNG"): "more pixels",
        encoded(Image.new("1", (8000, 8000)), "PNG"): "8000x8000 pixels, more than",
        encoded(Image.fromarray(PIXELS), "JPEG")[:200]: "truncated",
        b"hello": "not an image",
    }
    for data, reason in cases.items():
        with pytest.raises(ImageError, match=reason):
            decode(data)
    with pytest.raises(ImageError) as caught:
        decode(png, ImagePolicy(max_bytes=100))
    assert caught.value.status == 413 and caught.value.code == "image_too_large"


def test_sources(tmp_path: Path) -> None:
    png = encoded(Image.fromarray(PIXELS), "PNG")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    server = ImagePolicy()  # the server's default: data URLs and base64 only
    assert read_bytes(url, server) == png
    assert read_bytes(base64.b64encode(png).decode(), server) == png  # llama-server's raw base64
    (tmp_path / "a.png").write_bytes(png)
    for source, code in ((f"file://{tmp_path}/a.png", "local_images_disallowed"),
                         ("https://example.com/a.png", "remote_images_disallowed"),
                         (tmp_path / "a.png", "local_images_disallowed")):
        with pytest.raises(ImageError) as caught:
            read_bytes(source, server)
        assert caught.value.code == code
    with pytest.raises(ImageError, match="must be a data URL"):
        read_bytes(str(tmp_path / "a.png"), server)  # a plain path is no URL to a server
    # The CLI's and LLM's: plain paths and Path objects.
    np.testing.assert_array_equal(load(tmp_path / "a.png"), PIXELS)
    np.testing.assert_array_equal(load(str(tmp_path / "a.png")), PIXELS)
    assert load(PIXELS) is not None
    with pytest.raises(ImageError, match="RGB uint8"):
        load(PIXELS.astype(np.float32))
    with pytest.raises(ImageError, match="no such file"):
        load(tmp_path / "missing.png", LOCAL)
    with pytest.raises(ValueError, match="no such directory"):
        ImagePolicy(local_dir=str(tmp_path / "nowhere"))


def test_images_in_messages_render_as_markers() -> None:
    messages = with_images([{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "What is it?"}], [PIXELS, b"x"])
    refs = refs_in(messages)
    assert [r.param for r in refs] == ["images[0]", "images[1]"]
    assert messages[1]["content"][2] == {"type": "text", "text": "What is it?"}
    text = ChatTemplate().render(messages, add_generation_prompt=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                    f"{MEDIA_MARKER}{MEDIA_MARKER}What is it?<|im_end|>\n")
    parts = with_images([{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}])
    assert isinstance(parts[0]["content"][1], ImageRef)
    assert parts[0]["content"][1].param == "messages[0].content[1]"
    assert ChatTemplate("{{ messages[0]['content'] }}").render(parts) == f"a{MEDIA_MARKER}b\nc"
    with pytest.raises(ValueError, match="user message"):
        with_images([{"role": "system", "content": "x"}], [PIXELS])


def test_llm_chat_images_on_a_text_model(stories_path: Path, tmp_path: Path) -> None:
    llm = LLM(stories_path, n_threads=1)
    png = tmp_path / "cat.png"
    png.write_bytes(encoded(Image.fromarray(PIXELS), "PNG"))
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ValueError, match=r"^'images\[0\]': this model takes no images; load it "
                                         r"with mmproj=FILE"):
        llm.chat(messages, images=[png], max_tokens=2)
    with pytest.raises(ImageError, match=r"^images\[0\]: the image is 1x1 pixels"):
        llm.chat(messages, images=[np.zeros((1, 1, 3), np.uint8)], max_tokens=2)
    with pytest.raises(ImageError, match=r"^images\[0\]: the data is not an image"):
        llm.chat(messages, images=[b"not a picture"], max_tokens=2)
    with pytest.raises(ImageError, match="missing.png: no such file"):
        llm.chat(messages, images=[tmp_path / "missing.png"], max_tokens=2)
    part = {"type": "image_url", "image_url": {"url": f"file://{png}"}}
    with pytest.raises(ValueError, match=r"^'messages\[0\].content\[0\]': this model takes no"):
        llm.create_chat_completion([{"role": "user", "content": [part]}], max_tokens=2)
    assert llm.chat(messages, max_tokens=2).usage.completion_tokens == 2  # still usable
