"""Qwen2.5-VL's image preprocessing (ember.vision's PREPROCESSORS["qwen2.5vl_merger"]): the
dynamic resolution of transformers' Qwen2VLImageProcessor — the image resized to the size the
encoder gives (its preprocessed_size: smart_resize, each side a multiple of patch x merge, the
area within the file's pixel limits, the aspect kept), by a bicubic filter antialiased when
shrinking as PIL's BICUBIC (which the processor resizes with), then normalized with the file's
mean and std. The patch order is the encoder's business (cpp/vision/qwen25vl.cpp)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _cubic(x: np.ndarray) -> np.ndarray:
    """PIL's bicubic kernel (Keys, a = -0.5)."""
    a = -0.5
    x = np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _bicubic_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of the bicubic filter from n_in to n_out samples, its support
    widened by the scale when shrinking, each row normalized (as PIL's resample does)."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    centers = (np.arange(n_out) + 0.5) * scale
    j = np.arange(n_in) + 0.5
    w = _cubic((j[None, :] - centers[:, None]) / support)
    w /= w.sum(axis=1, keepdims=True)
    return w


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def resize_bicubic(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """uint8 (height, width, 3) pixels resized by a separable bicubic filter, the horizontal pass
    first, each pass rounded and clipped to uint8 as PIL does."""
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    out = pixels
    if width != w:
        cols = _bicubic_weights(w, width)   # [width, w]
        out = _to_uint8(np.einsum("xw,ywc->yxc", cols, out.astype(np.float64)))
    if height != h:
        rows = _bicubic_weights(h, height)  # [height, h]
        out = _to_uint8(np.einsum("yh,hwc->ywc", rows, out.astype(np.float64)))
    return out


def preprocess_qwen25vl(pixels: np.ndarray, projector: Any) -> np.ndarray:
    """float32 [3, H, W] of uint8 (height, width, 3) pixels, H and W the encoder's
    preprocessed_size of the image (multiples of 28)."""
    from .vision import normalize

    height, width = pixels.shape[:2]
    w, h = projector.preprocessed_size(width, height)
    return normalize(resize_bicubic(pixels, int(w), int(h)), projector.image_mean, projector.image_std)


def mrope_positions(tokens: list[int], image_token: int, grids: list[tuple[int, int]]) -> np.ndarray:
    """int32 [3, len(tokens)]: each token's (temporal, height, width) M-RoPE positions, as
    transformers' Qwen2_5_VLModel.get_rope_index gives them for images. A text token's three are
    equal, one past the previous token's largest; the k-th run of image_token (grids[k] = its
    merged (rows, columns)) starts at s, one past the text before it: temporal s, height s + row,
    width s + column, row-major; the text after it goes on from s + max(rows, columns).

    So a sequence's rope position and its token index part after an image (the index runs on by
    rows * columns, the position by max(rows, columns)); the caller keeps the difference (what
    transformers calls rope_deltas) to place the tokens it generates."""
    out = np.empty((3, len(tokens)), np.int32)
    next_pos, i, k = 0, 0, 0
    while i < len(tokens):
        if tokens[i] != image_token:
            out[:, i] = next_pos
            next_pos += 1
            i += 1
            continue
        if k >= len(grids):
            raise ValueError(f"image run {k + 1} at token {i} has no grid (got {len(grids)})")
        rows, cols = grids[k]
        if tokens[i:i + rows * cols] != [image_token] * (rows * cols):
            raise ValueError(f"image {k}: expected {rows * cols} image tokens at {i}")
        r, c = np.divmod(np.arange(rows * cols), cols)
        out[0, i:i + rows * cols] = next_pos
        out[1, i:i + rows * cols] = next_pos + r
        out[2, i:i + rows * cols] = next_pos + c
        next_pos += max(rows, cols)
        i += rows * cols
        k += 1
    if k != len(grids):
        raise ValueError(f"{len(grids)} image grids for {k} image runs")
    return out
