"""Images a prompt carries, from wherever they come to RGB pixels (the contract in ember.media):
where an image stands in a message (ImageRef), where its bytes may come from (ImagePolicy: data
URLs always; local files and remote URLs only where allowed), and decoding them (Pillow) under
limits, with an ImageError that says what is wrong.

Decoding: PNG, JPEG, WebP, GIF (its first frame) and BMP, by their content (a data URL's media
type is not trusted); the EXIF orientation applied; transparency composited on white (as a
viewer shows it); 16-bit samples scaled to 8 bits. The dimensions are checked from the header
before any pixel is decoded, so a small file that claims 20000x20000 pixels costs nothing.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

# Formats as Pillow names them (its JPEG reader also opens the multi-picture JPEGs of phones).
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_FORMAT_NAMES = "PNG, JPEG, WebP, GIF and BMP"

ImageSource = Union[str, bytes, bytearray, memoryview, os.PathLike, np.ndarray]


class ImageError(ValueError):
    """An image that cannot be used: what is wrong, with the HTTP status a server answers (413
    for more bytes than the limit, else 400) and a code for its error body."""

    def __init__(self, message: str, code: str = "invalid_image", status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class ImageRef:
    """An image where a message has it: its source (a URL, data URL, path, bytes or pixels) and
    where the request gave it (`param`, e.g. "messages[0].content[1]", for error messages).
    The chat template renders it as ember.media.MEDIA_MARKER."""

    source: ImageSource
    param: str = "image"


@dataclass(frozen=True)
class ImagePolicy:
    """Where images may come from, and how large they may be.

    max_bytes: an image file's bytes at most (llama-server's download limit, 10 MiB; a data URL
    is also bounded by the server's body size). max_pixels: width x height at most (50 M: a
    48-megapixel phone photo passes; its RGB pixels take 150 MB). min_side: the narrower side
    at least (a 1-pixel side carries no picture; the HF processors misread such arrays).
    max_images: images per request. local_dir: the directory (symlinks resolved) that file://
    URLs may read from, None: none; paths: plain paths are files too (the CLI, ember.LLM), else
    a string that is no URL is read as base64 (llama-server's raw base64). remote: http(s) URLs
    fetched (timeout seconds for the whole transfer)."""

    max_bytes: int = 10 << 20
    max_pixels: int = 50 * 1000 * 1000
    min_side: int = 2
    max_images: int = 8
    local_dir: str | None = None
    paths: bool = False
    remote: bool = False
    timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_pixels", "min_side", "max_images"):
            if getattr(self, name) < 1:
                raise ValueError(f"image limit {name} must be >= 1, got {getattr(self, name)}")
        if self.local_dir is not None and not Path(self.local_dir).is_dir():
            raise ValueError(f"{self.local_dir}: no such directory (for local images)")


LOCAL = ImagePolicy(local_dir="/", paths=True)  # the CLI's and ember.LLM's: the user's own files


def image_part(part: Mapping[str, Any], param: str) -> ImageRef:
    """An OpenAI image_url content part ({"type": "image_url", "image_url": {"url": ...,
    "detail": ...}}, or "image_url": URL) as an ImageRef; ImageError naming `param` when it is
    malformed. `detail` is accepted and has no effect: the model's projector decides the
    resolution."""
    value = part.get("image_url")
    if isinstance(value, Mapping):
        detail = value.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise ImageError(f"'{param}.image_url.detail' must be 'auto', 'low' or 'high', "
                             f"got {detail!r}"[:200], "invalid_value")
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ImageError(f"'{param}': an image_url part needs \"image_url\": {{\"url\": "
                         "\"data:image/png;base64,...\"}} (or a URL string)", "invalid_value")
    return ImageRef(value, param)


def _data_url(url: str, policy: ImagePolicy) -> bytes:
    head, comma, data = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise ImageError("a data URL must be base64: data:image/png;base64,...")
    media_type = head[len("data:"):-len(";base64")]
    if media_type and not media_type.startswith("image/"):
        raise ImageError(f"a data URL of type {media_type!r} is no image (data:image/...)"[:200])
    return _base64(data, policy)


def _base64(data: str, policy: ImagePolicy) -> bytes:
    if len(data) // 4 * 3 > policy.max_bytes + 3:  # before decoding it
        raise _too_many_bytes(len(data) // 4 * 3, policy)
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image data is not valid base64") from None


def _too_many_bytes(n_bytes: int, policy: ImagePolicy) -> ImageError:
    return ImageError(f"the image has {n_bytes} bytes, more than this server's limit of "
                      f"{policy.max_bytes}", "image_too_large", 413)


def _local_file(path: str, policy: ImagePolicy, shown: str) -> bytes:
    root = policy.local_dir
    if root is None:
        raise ImageError("local files are not allowed here (a server reads them only under "
                         "--allowed-local-media-path DIR); send the image as a data URL",
                         "local_images_disallowed")
    root_real = os.path.realpath(root)
    # A relative path: from the current directory where plain paths are files (the CLI's),
    # else from the directory (llama-server's file://NAME under --media-path).
    base = os.getcwd() if policy.paths else root_real
    real = os.path.realpath(os.path.join(base, os.path.expanduser(path)))
    if os.path.commonpath([real, root_real]) != root_real:
        raise ImageError(f"{shown} is outside the directory local images may come from",
                         "local_images_disallowed")
    try:
        with open(real, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > policy.max_bytes:
                raise _too_many_bytes(size, policy)
            return f.read(policy.max_bytes + 1)
    except IsADirectoryError:
        raise ImageError(f"{shown} is a directory, not an image file") from None
    except FileNotFoundError:
        raise ImageError(f"{shown}: no such file") from None
    except OSError as err:
        raise ImageError(f"{shown}: cannot read it ({err.strerror or err})") from None


def _remote(url: str, policy: ImagePolicy) -> bytes:
    if not policy.remote:
        raise ImageError("remote image URLs are not allowed here (a server fetches them only "
                         "with --allow-remote-images); send the image as a data URL",
                         "remote_images_disallowed")
    deadline = time.monotonic() + policy.timeout
    request = urllib.request.Request(url, headers={"User-Agent": "ember"})
    shown = url if len(url) <= 100 else url[:100] + "..."
    try:
        with urllib.request.urlopen(request, timeout=policy.timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > policy.max_bytes:
                raise _too_many_bytes(int(length), policy)
            chunks: list[bytes] = []
            n_bytes = 0
            while chunk := response.read(1 << 16):
                n_bytes += len(chunk)
                if n_bytes > policy.max_bytes:
                    raise _too_many_bytes(n_bytes, policy)
                if time.monotonic() > deadline:
                    raise ImageError(f"fetching {shown} took more than {policy.timeout:g} s",
                                     "image_fetch_failed")
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as err:
        raise ImageError(f"fetching {shown} failed: HTTP {err.code}", "image_fetch_failed") \
            from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ImageError(f"fetching {shown} failed: {reason}", "image_fetch_failed") from None


def read_bytes(source: ImageSource, policy: ImagePolicy) -> bytes:
    """The bytes of an image source under `policy`: data URLs, file:// URLs (under
    policy.local_dir), http(s) URLs (policy.remote), plain paths (policy.paths, else base64
    text), bytes as they are."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, os.PathLike):
        if not policy.paths:
            raise ImageError("local files are not allowed here", "local_images_disallowed")
        data = _local_file(os.fspath(source), policy, os.fspath(source))
    elif isinstance(source, str):
        scheme = source[:8].lower()
        if scheme.startswith("data:"):
            data = _data_url(source, policy)
        elif scheme.startswith(("http://", "https://")):
            data = _remote(source, policy)
        elif scheme.startswith("file://"):
            path = urllib.request.url2pathname(source[len("file://"):])
            data = _local_file(path, policy, source)
        elif policy.paths:
            data = _local_file(source, policy, source)
        else:
            try:
                data = _base64(source, policy)
            except ImageError as err:
                if err.status == 413:
                    raise
                raise ImageError("the image must be a data URL (data:image/png;base64,...), an "
                                 "http(s) or file:// URL, or base64 data") from None
    else:
        raise ImageError(f"an image must be a path, URL, bytes or an RGB array, got "
                         f"{type(source).__name__}")
    if len(data) > policy.max_bytes:
        raise _too_many_bytes(len(data), policy)
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    return data


def _check_size(width: int, height: int, policy: ImagePolicy) -> None:
    if width * height > policy.max_pixels:
        raise ImageError(f"the image is {width}x{height} pixels, more than this server's limit "
                         f"of {policy.max_pixels} pixels", "image_too_large")
    if min(width, height) < policy.min_side:
        raise ImageError(f"the image is {width}x{height} pixels; each side must have at least "
                         f"{policy.min_side}", "image_too_small")


def decode(data: bytes, policy: ImagePolicy = LOCAL) -> np.ndarray:
    """RGB pixels, uint8 [height, width, 3], of an image file's bytes; ImageError for what is
    no image of a known format, a truncated or corrupt one, or one outside policy's limits."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if len(data) > policy.max_bytes:
        raise _too_many_bytes(len(data), policy)
    Image.init()  # registers every format's reader (once), WebP's among them
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise ImageError(f"the data is not an image of a known format ({_FORMAT_NAMES} are)") \
            from None
    except Image.DecompressionBombError:
        raise ImageError(f"the image has more pixels than this server's limit of "
                         f"{policy.max_pixels}", "image_too_large") from None
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        raise ImageError(f"the image is truncated or corrupt ({err})") from None
    with image:
        _check_size(image.width, image.height, policy)  # from the header: nothing decoded yet
        try:
            image.seek(0)  # an animation's first frame
            image.load()
            upright = ImageOps.exif_transpose(image)
            return _rgb(upright)
        except (OSError, SyntaxError, ValueError, EOFError, IndexError) as err:
            raise ImageError(f"the image data is truncated or corrupt ({err})") from None


def _rgb(image: Any) -> np.ndarray:
    from PIL import Image

    if image.mode.startswith("I;16") or image.mode == "I":  # 16-bit grey: scale, not clip
        grey = np.asarray(image, dtype=np.float64)
        grey = np.clip(np.rint(grey / 257.0), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    return np.array(image.convert("RGB"), dtype=np.uint8)


def pixels(array: np.ndarray, policy: ImagePolicy = LOCAL) -> np.ndarray:
    """An RGB array given as pixels, checked: uint8 [height, width, 3] within policy's limits."""
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ImageError(f"an image array must be RGB uint8 of shape (height, width, 3), got "
                         f"{array.dtype} {array.shape}")
    _check_size(array.shape[1], array.shape[0], policy)
    return np.ascontiguousarray(array)


def load(source: ImageSource, policy: ImagePolicy = LOCAL) -> np.ndarray:
    """The RGB pixels of an image source (see read_bytes; an array is checked as it is)."""
    if isinstance(source, np.ndarray):
        return pixels(source, policy)
    return decode(read_bytes(source, policy), policy)


def check_count(n_images: int, policy: ImagePolicy) -> None:
    if n_images > policy.max_images:
        raise ImageError(f"the request has {n_images} images, more than this server's limit "
                         f"of {policy.max_images}", "too_many_images")


def refs_in(messages: Sequence[Mapping[str, Any]]) -> list[ImageRef]:
    """The images of chat messages (ImageRefs among their content parts), in their order: the
    order of their markers in the rendered prompt."""
    return [part for message in messages if isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, ImageRef)]


def with_images(messages: Sequence[Mapping[str, Any]], images: Sequence[ImageSource] = ()
                ) -> list[dict[str, Any]]:
    """Chat messages whose image_url parts are ImageRefs, with `images` (paths, bytes, URLs or
    RGB arrays) before the text of the last user message, as the Gemma 3 and Qwen2.5-VL model
    cards place a picture (ember.LLM.chat's images=, `ember run --image`)."""
    out = []
    for i, message in enumerate(messages):
        copy = dict(message)
        content = copy.get("content")
        if isinstance(content, list):
            copy["content"] = [image_part(p, f"messages[{i}].content[{j}]")
                               if isinstance(p, Mapping) and p.get("type") == "image_url" else p
                               for j, p in enumerate(content)]
        out.append(copy)
    if images:
        last = next((m for m in reversed(out) if m.get("role") == "user"), None)
        if last is None:
            raise ValueError("images go with a user message; the messages have none")
        content = last.get("content")
        text = [{"type": "text", "text": content}] if isinstance(content, str) and content \
            else list(content or [])
        last["content"] = [ImageRef(image, f"images[{k}]") for k, image in enumerate(images)] \
            + text
    return out
