"""Embeddings on a server started with `ember serve --embedding`: OpenAI's POST /v1/embeddings,
and llama-server's native POST /embedding (and /embeddings, its alias there). An encoder (bert)
serves only these; a decoder (Qwen3-Embedding, or any chat model) its chat routes beside them.

    /v1/embeddings: {"input": "text" | ["text", ...] | [id, ...] | [[id, ...], ...], "model"?,
     "encoding_format"?: "float" | "base64", "dimensions"?: n_embd, "user"?}
    -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}],
        "model", "usage": {"prompt_tokens", "total_tokens"}}
    /embedding: {"content" (or "input"): the same forms, "embd_normalize"?: -1 | 0 | 1 | 2 | p}
    -> [{"index": i, "embedding": [[...]]}]  (one pooled vector per input, in a list, as
       llama-server gives it for pooled models; with pooling none every token's vector,
       unnormalized, and /v1/embeddings answers 400, as llama-server's)

base64 is the little-endian float32 bytes of each vector, as OpenAI's client decodes it.
embd_normalize is llama-server's (common_embd_normalize): -1 none, 0 max absolute scaled to the
int16 range, 1 taxicab, 2 Euclidean (the default, as OpenAI's vectors), p > 2 the p-norm (with
pooling none it is ignored, as llama-server ignores it). Every input of a request is embedded in
one call (packed into shared forward passes); requests take turns. A server started without
--embedding answers these routes with a 501 (as llama-server), and an encoder's server its
generation routes with a 400 (AppContext.require_ready).
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
from ember.server.fields import Fields, show

FIELDS = frozenset({"input", "model", "encoding_format", "dimensions", "user"})


def _options(body: Fields, embedder: Embedder) -> str:
    """The encoding asked for; a 400 for any field outside FIELDS."""
    body.only(FIELDS, "/v1/embeddings")
    encoding = body.body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {show(encoding)}",
                          param="encoding_format", code="invalid_value")
    dims = body.integer("dimensions")
    if dims is not None and dims != embedder.n_embd:
        raise bad_request(f"'dimensions' must be {embedder.n_embd} for this model (it cannot "
                          f"shorten its embeddings), got {dims}", param="dimensions",
                          code="invalid_value")
    body.string("user")
    return encoding


def _inputs(body: Fields, param: str) -> list[str | list[int]]:
    """Texts or token-id lists (one embedding each); the embedder checks the ids."""
    return [p[0] if p and isinstance(p[0], str) else p  # type: ignore[misc]
            for p in body.token_prompts(param, limit=None)]


def _vector(row: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return row.tolist()


def _require_embedder(request: Request, ctx: AppContext) -> Embedder:
    if ctx.embedder is None:
        ctx.require_ready()  # 503 while loading or shutting down
        raise APIError(501, f"{request.url.path}: this server does not embed; start it with "
                       "`ember serve MODEL --embedding` (any model; --pooling picks how)",
                       code="not_supported", error_type="not_supported_error")
    return ctx.embedder


async def _embed(embedder: Embedder, inputs: list[str | list[int]], param: str,
                 normalize: bool = True) -> tuple[list[list[int]], np.ndarray]:
    """The inputs' tokens and their pooled vectors [len(inputs), n_embd] (of unit length
    unless normalize=False); a 400 naming `param` for an empty or too long input."""
    try:
        tokens = embedder.tokenize(inputs)
        return tokens, await asyncio.to_thread(embedder.embed_tokens, tokens, normalize)
    except ValueError as err:  # an empty or too long input, a token id out of range
        raise bad_request(str(err).removeprefix("[embed] "), param=param,
                          code="invalid_value") from None


async def vectors_json(ctx: AppContext, out: Any, n_vectors: int) -> Response:
    # Serializing many vectors holds the GIL for milliseconds: off the loop past a few.
    payload = dumps(out) if n_vectors <= 16 else await ctx.in_worker(dumps, out)
    return Response(payload, media_type="application/json")


async def embeddings(request: Request, ctx: AppContext) -> Response:
    body = Fields(await ctx.read_json(request))
    embedder = _require_embedder(request, ctx)
    if embedder.pooling == "none":
        raise bad_request("pooling 'none' gives every token's vector, which /v1/embeddings "
                          "cannot return; use /embedding, or start the server with --pooling "
                          "mean, cls or last", code="invalid_request")
    encoding = _options(body, embedder)
    tokens, vectors = await _embed(embedder, _inputs(body, "input"), "input")
    n_tokens = sum(len(t) for t in tokens)
    out = {"object": "list",
           "data": [{"object": "embedding", "index": i, "embedding": _vector(v, encoding)}
                    for i, v in enumerate(vectors)],
           "model": ctx.model_name,
           "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
    return await vectors_json(ctx, out, len(vectors))


def normalized(vectors: np.ndarray, embd_normalize: int) -> np.ndarray:
    """llama-server's embd_normalize of raw pooled vectors [n, n_embd] (see the module doc);
    a zero vector stays zero."""
    v = vectors.astype(np.float64)
    if embd_normalize == -1:
        return vectors
    if embd_normalize == 0:
        norm = np.abs(v).max(axis=1) / 32760.0
    else:
        norm = (np.abs(v) ** embd_normalize).sum(axis=1) ** (1.0 / embd_normalize)
    scale = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)
    return (v * scale[:, None]).astype(np.float32)


async def native_embedding(request: Request, ctx: AppContext) -> Response:
    """llama-server's /embedding: `content` (or `input`) in the same forms as OpenAI's
    input; each input's pooled vector, normalized as embd_normalize says."""
    body = Fields(await ctx.read_json(request))
    embedder = _require_embedder(request, ctx)
    param = "content" if "content" in body.body else "input"
    norm = body.integer("embd_normalize", low=-1)  # -1 none, 0 max absolute, 1 taxicab, ...
    norm = 2 if norm is None else norm
    inputs = _inputs(body, param)
    if embedder.pooling == "none":  # every token's vector, unnormalized (llama-server's)
        try:
            rows = await asyncio.to_thread(embedder.token_embeddings, embedder.tokenize(inputs))
        except ValueError as err:
            raise bad_request(str(err).removeprefix("[embed] "), param=param,
                              code="invalid_value") from None
        out: Any = [{"index": i, "embedding": r.tolist()} for i, r in enumerate(rows)]
        return await vectors_json(ctx, out, sum(len(r) for r in rows))
    if norm == 2:
        _, vectors = await _embed(embedder, inputs, param)
    else:
        _, raw = await _embed(embedder, inputs, param, normalize=False)
        vectors = normalized(raw, norm)
    out = [{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)]
    return await vectors_json(ctx, out, len(vectors))
