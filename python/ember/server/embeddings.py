"""POST /v1/embeddings (OpenAI's embeddings API), answered by a server started with
`ember serve --embedding` on an embedding model (bert).

    {"input": "text" | ["text", ...] | [id, ...] | [[id, ...], ...], "model"?,
     "encoding_format"?: "float" | "base64", "dimensions"?: n_embd, "user"?}
    -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}],
        "model", "usage": {"prompt_tokens", "total_tokens"}}

base64 is the little-endian float32 bytes of each vector, as OpenAI's client decodes it. Every
input of a request is embedded in one call (packed into shared forward passes); requests take
turns. A generation server answers this route with a 501 (as llama-server without --embedding),
and this server's generation routes answer 400 (AppContext.require_ready).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ember.embeddings import Embedder
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, dumps

FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The request's inputs: texts, or token-id lists; a 400 naming "input" otherwise."""
    value = body.get("input")
    shape = "a string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise bad_request(f"'input' must be {shape} (non-empty)", param="input",
                          code="invalid_value")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
           for v in value):
        return list(value)
    raise bad_request(f"'input' must be {shape}, not a mix", param="input", code="invalid_value")


def _check_options(body: dict[str, Any], embedder: Embedder) -> str:
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field '{unknown[0]}' for /v1/embeddings (accepted: "
                          f"{', '.join(sorted(FIELDS))})", param=unknown[0], code="invalid_field")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}",
                          param="encoding_format", code="invalid_value")
    dims = body.get("dimensions")
    if dims is not None and dims != embedder.n_embd:
        raise bad_request(f"'dimensions' must be {embedder.n_embd} for this model (it cannot "
                          f"shorten its embeddings), got {dims!r}", param="dimensions",
                          code="invalid_value")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("'user' must be a string", param="user", code="invalid_value")
    return encoding


def _vector(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return row.tolist()


async def embeddings(request: Request, ctx: AppContext) -> Response:
    body = await ctx.read_json(request)
    embedder = ctx.embedder
    if embedder is None:
        ctx.require_ready()  # 503 while loading or shutting down
        raise APIError(501, f"{request.url.path}: this server has no embedding model; start "
                       "`ember serve --embedding` with one (bert)", code="not_supported",
                       error_type="not_supported_error")
    name = ctx.check_model(body.get("model"))
    encoding = _check_options(body, embedder)
    try:
        tokens = embedder.tokenize(_inputs(body))
        vectors = await asyncio.to_thread(embedder.embed_tokens, tokens)
    except ValueError as err:  # an empty or too long input, a token id out of range
        raise bad_request(str(err).removeprefix("[embed] "), param="input",
                          code="invalid_value") from None
    n_tokens = sum(len(t) for t in tokens)
    out = {"object": "list",
           "data": [{"object": "embedding", "index": i, "embedding": _vector(v, encoding)}
                    for i, v in enumerate(vectors)],
           "model": name,
           "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
    # Serializing many vectors holds the GIL for milliseconds: off the loop past a few.
    payload = dumps(out) if len(vectors) <= 16 else await ctx.in_worker(dumps, out)
    return Response(payload, media_type="application/json")
