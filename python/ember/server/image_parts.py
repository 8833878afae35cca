"""The images of a request's messages (ember.images.ImageRef, which protocol.py makes of OpenAI's
image_url parts and the Anthropic and Responses translations make of theirs), read and decoded
under the server's ImagePolicy before the prompt is rendered.

Each image is read (a data URL decoded, an allowed file read, an allowed URL fetched: in a
thread of its own, so a slow download holds up no other request) and decoded to RGB pixels in
the worker; any failure is a 400 (413 for too many bytes) naming the image's part. Only then is
the model asked: one without a vision projector answers a 400 naming the first image.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from ember.images import ImageError, ImageRef, check_count, decode, read_bytes
from ember.server.context import AppContext
from ember.server.errors import APIError

Pixels = dict[int, np.ndarray]  # id(ImageRef) -> its RGB pixels, uint8 [height, width, 3]


def image_error(err: ImageError, param: str) -> APIError:
    return APIError(err.status, f"'{param}': {err}", param=param, code=err.code)


def no_vision(param: str) -> APIError:
    return APIError(400, f"'{param}': this model takes no images; start the server with "
                    "--mmproj FILE (the model's vision projector)", param=param,
                    code="unsupported_content")


async def load_images(ctx: AppContext, refs: Sequence[ImageRef]) -> Pixels:
    """The pixels of `refs`, checked against the server's limits, then the model's vision."""
    policy = ctx.config.image_policy
    if not refs:
        return {}
    try:
        check_count(len(refs), policy)
    except ImageError as err:
        raise image_error(err, refs[policy.max_images].param) from None
    pixels: Pixels = {}
    for ref in refs:
        try:
            data = await asyncio.to_thread(read_bytes, ref.source, policy)
            pixels[id(ref)] = await ctx.in_worker(decode, data, policy)
        except ImageError as err:
            raise image_error(err, ref.param) from None
    if not ctx.require_ready().vision:
        raise no_vision(refs[0].param)
    return pixels
