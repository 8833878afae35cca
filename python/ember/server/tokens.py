"""llama-server's and vLLM's POST /tokenize and POST /detokenize."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ember.engine import Engine
from ember.server.context import AppContext
from ember.server.errors import bad_request, dumps, json_response
from ember.server.fields import Fields
from ember.server.prompts import render_chat, text_tokens
from ember.server.protocol import parse_messages


async def tokenize(request: Request, ctx: AppContext) -> Response:
    """llama-server's and vLLM's /tokenize: {"content" | "prompt": text} or {"messages": [...]}
    -> {"tokens", "count", "max_model_len"}. add_special (default true, as for /v1/completions
    prompts) and parse_special (default true); with_pieces gives {"id", "piece"} pairs."""
    body = await ctx.read_json(request)
    engine = ctx.require_ready()
    fields = Fields(body)
    add_special = fields.boolean("add_special",
                                 default=fields.boolean("add_special_tokens", default=True))
    parse_special = fields.boolean("parse_special", default=True)
    with_pieces = fields.boolean("with_pieces")
    if body.get("messages") is not None:
        messages = await ctx.offload(request, parse_messages, body)
        prompt = await ctx.in_worker(render_chat, ctx, messages, within_context=False)
        tokens = prompt.tokens
    else:
        text = fields.string("content")
        if text is None:
            text = fields.string("prompt")
        if text is None:
            raise bad_request("send the text to tokenize as 'content' (or 'prompt'), or chat "
                              "'messages'", param="content", code="missing_required")
        tokens = await text_tokens(ctx, text, add_special, parse_special, param="content",
                                   within_context=False)
    content = await ctx.offload(request, _tokenize_response, engine, tokens, with_pieces)
    return Response(content, media_type="application/json")


def _tokenize_response(engine: Engine, tokens: list[int], with_pieces: bool) -> bytes:
    """The /tokenize body, serialized in slices: json.dumps holds the GIL for its whole run
    (40+ ms for a million ids), and this runs beside the event loop."""
    out: list[Any] = tokens
    if with_pieces:
        piece = engine.tokenizer.token_to_piece
        out = [{"id": t, "piece": piece(t).decode("utf-8", errors="replace")} for t in tokens]
    step = 4096
    items = b",".join(dumps(out[i:i + step])[1:-1] for i in range(0, len(out), step))
    tail = dumps({"count": len(tokens), "max_model_len": engine.n_ctx})
    return b'{"tokens":[' + items + b"]," + tail[1:]


async def detokenize(request: Request, ctx: AppContext) -> Response:
    body = await ctx.read_json(request)
    engine = ctx.require_ready()
    text = await ctx.offload(request, _detokenize, engine, body)
    return json_response({"content": text})


def _detokenize(engine: Engine, body: dict[str, Any]) -> str:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("'tokens' must be an array of token ids", param="tokens",
                          code="invalid_type")
    n_vocab = engine.n_vocab
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is out of range [0, {n_vocab})",
                          param="tokens", code="invalid_value")
    return engine.tokenizer.decode(tokens, skip_special=True)


