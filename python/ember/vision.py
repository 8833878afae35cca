"""The Python side of vision projectors (mmproj files, see cpp/vision/vision_model.h): turning a
door's RGB pixels (ember.media: uint8 (height, width, 3)) into what an encoder takes, float32
[3, height, width] resized and normalized, and the content hash an image is cached by.

One preprocessing function per projector type, in PREPROCESSORS (the one table a new tower adds
its function to, beside its C++ file): it gets the pixels and the projector (an object with the
attributes of ember._core.VisionModel: projector_type, image_size, patch_size, image_mean,
image_std, spatial_merge_size, preprocessed_size(width, height)) and returns the float32
planes. IMAGE_TOKENS (likewise per projector type) names the text tokens that frame an image's
run of soft tokens in a prompt, as llama.cpp's mtmd writes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .vision_qwen25vl import preprocess_qwen25vl


def image_hash(pixels: np.ndarray) -> int:
    """A 63-bit content hash of an image's pixels and shape: equal images are encoded once and
    share their prefix-cache entries (the engine keys image positions by it)."""
    pixels = np.ascontiguousarray(pixels)
    digest = hashlib.blake2b(pixels.tobytes(), digest_size=8,
                             person=b"ember-img").digest()
    h = int.from_bytes(digest, "little") ^ hash_shape(pixels.shape)
    return h & ((1 << 63) - 1)


def hash_shape(shape: tuple[int, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(repr(tuple(shape)).encode(), digest_size=8).digest(),
                          "little")


def check_pixels(pixels: Any, index: int = 0) -> np.ndarray:
    """The image as ember.media specifies it, uint8 (height, width, 3), or ValueError naming it."""
    array = np.asarray(pixels)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"image {index}: expected RGB pixels, a uint8 array of shape "
                         f"(height, width, 3), got {array.dtype} {tuple(array.shape)}")
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"image {index}: it has no pixels ({array.shape[1]}x{array.shape[0]})")
    return array


def _resample_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of a triangle (bilinear) filter from n_in to n_out samples, its
    support widened by the scale when shrinking (antialiased, as PIL's BILINEAR resize, which
    transformers' image processors use)."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    centers = (np.arange(n_out) + 0.5) * scale
    j = np.arange(n_in) + 0.5
    w = np.maximum(0.0, 1.0 - np.abs(j[None, :] - centers[:, None]) / support)
    w /= w.sum(axis=1, keepdims=True)
    return w.astype(np.float64)


def resize_bilinear(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 (height, width, 3) pixels resized by a separable bilinear filter (antialiased when
    shrinking), rounded back to uint8 as PIL rounds; float64 in between."""
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    rows = _resample_weights(h, height)  # [height, h]
    cols = _resample_weights(w, width)   # [width, w]
    out = np.einsum("yh,hwc->ywc", rows, pixels.astype(np.float64))
    out = np.einsum("xw,ywc->yxc", cols, out)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def normalize(pixels: np.ndarray, mean: Any, std: Any) -> np.ndarray:
    """float32 planes [3, height, width] of uint8 pixels: (p / 255 - mean) / std per channel."""
    x = pixels.astype(np.float32) * np.float32(1 / 255)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess_gemma3(pixels: np.ndarray, projector: Any) -> np.ndarray:
    """Gemma 3 (SigLIP): resized to image_size x image_size, whatever the aspect, normalized."""
    side = int(projector.image_size)
    return normalize(resize_bilinear(pixels, side, side), projector.image_mean,
                     projector.image_std)


PREPROCESSORS: dict[str, Callable[[np.ndarray, Any], np.ndarray]] = {
    "gemma3": preprocess_gemma3,
    "qwen2.5vl_merger": preprocess_qwen25vl,
    "qwen25vl": preprocess_qwen25vl,
}


@dataclass(frozen=True)
class ImageTokens:
    """The text tokens around an image's run of soft tokens (the run itself is `soft` repeated
    the encoder's n_tokens times), by their vocabulary texts."""
    begin: str
    soft: str
    end: str
    # Image tokens attend to every token of their own image (transformers' Gemma 3 makes the
    # image's block bidirectional; llama.cpp decodes an image's batch non-causally).
    bidirectional: bool = False


IMAGE_TOKENS: dict[str, ImageTokens] = {
    "gemma3": ImageTokens("<start_of_image>", "<image_soft_token>", "<end_of_image>",
                          bidirectional=True),
    # Qwen2.5-VL: its image tokens attend causally (transformers' and llama.cpp's).
    "qwen2.5vl_merger": ImageTokens("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
    "qwen25vl": ImageTokens("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
}


def preprocess(pixels: Any, projector: Any, index: int = 0) -> np.ndarray:
    """The float32 [3, height, width] planes projector's encoder takes for an RGB image."""
    array = check_pixels(pixels, index)
    try:
        fn = PREPROCESSORS[projector.projector_type]
    except KeyError:
        raise ValueError(f"no image preprocessing for projector type "
                         f"{projector.projector_type!r}") from None
    return fn(array, projector)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def placeholder_tokens(image_hash_: int, n_tokens: int, n_vocab: int) -> list[int]:
    """The token ids an image's run carries into the engine: pseudo-random ids derived from its
    content hash (as llama-server keys its cache by the image's id), so that the prefix cache
    matches image positions by the image, and two images never share cached K/V. The forward
    pass never reads them: those rows take the image's embeddings."""
    return [_splitmix64(image_hash_ + i) % n_vocab for i in range(n_tokens)]


class ImagePrompts:
    """An engine's images: the projector (ember._core.VisionModel's attributes) and the
    tokenizer's ids of its image tokens. Expands markers into image runs (image_tokens) and
    turns a prompt's runs and images into what the C++ engine takes (request_images)."""

    def __init__(self, projector: Any, tokenizer: Any) -> None:
        self.projector = projector
        self.n_vocab = int(tokenizer.n_vocab)
        kind = projector.projector_type
        if kind not in IMAGE_TOKENS or kind not in PREPROCESSORS:
            raise ValueError(f"the vision projector's type {kind!r} has no image tokens or "
                             f"preprocessing in ember")
        spec = IMAGE_TOKENS[kind]

        def token(text: str) -> int:
            ids = list(tokenizer.encode(text, False, True))
            if len(ids) != 1:
                raise ValueError(f"the model's vocabulary has no {text!r} token, which "
                                 f"{kind} images need")
            return ids[0]
        self.begin, self.soft, self.end = token(spec.begin), token(spec.soft), token(spec.end)

    def n_tokens(self, image: Any, index: int = 0) -> int:
        """The image tokens `image` (RGB uint8 (h, w, 3)) becomes."""
        pixels = check_pixels(image, index)
        width, height = self.projector.preprocessed_size(pixels.shape[1], pixels.shape[0])
        return int(self.projector.n_tokens(width, height))

    def image_tokens(self, image: Any, index: int = 0) -> list[int]:
        """The prompt's run for `image`: begin, the soft token n_tokens times, end."""
        return [self.begin, *[self.soft] * self.n_tokens(image, index), self.end]

    def request_images(self, tokens: list[int], images: Any
                       ) -> tuple[list[int], list[tuple[int, int, int, np.ndarray]]]:
        """(the tokens the engine runs: each image's run of soft tokens replaced by its
        placeholder_tokens, and per image (first position, tokens, hash, preprocessed
        pixels)), the runs found in order. ValueError when an image has no run of its length."""
        out = list(tokens)
        core: list[tuple[int, int, int, np.ndarray]] = []
        cursor = 0
        for i, image in enumerate(images):
            pixels = check_pixels(image, i)
            n = self.n_tokens(pixels, i)
            while cursor < len(tokens) and tokens[cursor] != self.soft:
                cursor += 1
            run_end = cursor
            while run_end < len(tokens) and tokens[run_end] == self.soft:
                run_end += 1
            if run_end - cursor != n:
                found = (f"a run of {run_end - cursor}" if run_end > cursor
                         else "no further run")
                raise ValueError(f"image {i} needs a run of {n} image tokens in the prompt; "
                                 f"it has {found} (tokenize the prompt with tokenize_images)")
            h = image_hash(pixels)
            out[cursor:run_end] = placeholder_tokens(h, n, self.n_vocab)
            core.append((cursor, n, h, preprocess(pixels, self.projector, i)))
            cursor = run_end
        return out, core
