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
