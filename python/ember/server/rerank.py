"""llama-server's reranking endpoint, POST /rerank (and /reranking, /v1/rerank, /v1/reranking),
answered by `ember serve --rerank` on a reranker: a cross-encoder (a converted
BertForSequenceClassification) or a decoder classifier (pooling rank: a converted
Qwen3ForSequenceClassification, Qwen3-Reranker); ember.embeddings.Embedder.rerank scores the
pairs.

    Jina / Cohere shape: {"query", "documents": ["text", ...], "top_n"?, "return_documents"?,
                          "model"?}
    -> {"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
        "results": [{"index", "relevance_score", "document"?: {"text"}}, ...]}
    TEI shape: {"query", "texts": [...], "return_text"?} -> [{"index", "score", "text"?}, ...]

Results are sorted by score, highest first, and cut to top_n (every document by default), as
llama-server sorts them; scores are the head's raw logits, as llama-server reports them (a
decoder's yes/no head: P(yes)).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ember.server.context import AppContext
from ember.server.embeddings import vectors_json
from ember.server.errors import APIError, bad_request
from ember.server.fields import Fields, check_text

MAX_DOCUMENTS = 1024


def _documents(body: Fields, key: str) -> list[str]:
    value = body.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(d, str) for d in value):
        raise bad_request(f"'{key}' must be a non-empty array of strings", param=key,
                          code="invalid_value")
    if len(value) > MAX_DOCUMENTS:
        raise bad_request(f"'{key}' has {len(value)} documents; at most {MAX_DOCUMENTS} are "
                          "allowed per request", param=key, code="invalid_value")
    for text in value:
        check_text(text, key)
    return value


async def rerank(request: Request, ctx: AppContext) -> Response:
    raw = await ctx.read_json(request)
    embedder = ctx.embedder
    if embedder is None or not ctx.config.rerank:
        if embedder is None:
            ctx.require_ready()  # 503 while loading or shutting down
        raise APIError(501, f"{request.url.path}: this server does not rerank; start `ember "
                       "serve --rerank` with a reranking model (a cross-encoder such as a "
                       "converted BertForSequenceClassification, or a decoder classifier such "
                       "as Qwen3ForSequenceClassification)", code="not_supported",
                       error_type="not_supported_error")
    body = Fields(raw)
    query = body.string("query")
    if query is None:
        raise bad_request("'query' is required (a string)", param="query",
                          code="missing_required")
    check_text(query, "query")
    tei = "texts" in raw  # Hugging Face text-embeddings-inference's spelling
    key = "texts" if tei else "documents"
    documents = _documents(body, key)
    top_n = body.integer("top_n", low=1)
    body.string("model")  # any name is answered by the served model
    try:
        tokens, types = embedder.pair_tokens(query, documents)
        scores = await asyncio.to_thread(embedder.rerank_tokens, tokens, types)
    except ValueError as err:  # a pair longer than the model's context
        raise bad_request(str(err), param=key, code="invalid_value") from None
    order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))[:top_n]
    if tei:
        with_text = body.boolean("return_text")
        out: Any = [{"index": i, "score": float(scores[i]),
                     **({"text": documents[i]} if with_text else {})} for i in order]
        return await vectors_json(ctx, out, len(order))
    with_documents = body.boolean("return_documents")
    n_tokens = sum(len(t) for t in tokens)
    out = {"model": ctx.model_name, "object": "list",
           "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
           "results": [{"index": i, "relevance_score": float(scores[i]),
                        **({"document": {"text": documents[i]}} if with_documents else {})}
                       for i in order]}
    return await vectors_json(ctx, out, len(order))
