"""The Starlette application: routes, API-key check, CORS, model loading and shutdown.

    app = create_app(ServerConfig(model="model.gguf", parallel=4))

Layout of ember.server: app.py (this: routes and middleware), context.py (AppContext: state and
request helpers), generation.py (OpenAI's completion endpoints and the request path all APIs
share), llama_api.py (llama-server's native API), responses_api.py (OpenAI Responses),
anthropic_api.py (Anthropic Messages), protocol.py + llama_fields.py (request validation),
fim.py, scoring.py, webui.py (the chat page), browser.py (Host and CORS rules), errors.py,
metrics.py, config.py, run.py (uvicorn). OpenAI responses are shaped by ember.openai_format;
generation runs on ember.engine.

The model loads in a background thread once the server listens: /health answers 503 while it
loads, then 200 {"status": "ok"}. Every route but /health and the chat page at / needs the API
key when one is set;
every route needs a Host header that names this server (browser.py).
With one model served, a request's `model` may name anything: it is answered by the served model,
under its id (the first --alias, else the file name), as llama-server does. /v1/models lists the
id and the other aliases; GET /v1/models/NAME answers for those names and the file's (404 else).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ember.engine import Engine
from ember.server import (
    anthropic_api,
    embeddings,
    generation,
    llama_api,
    rerank,
    responses_api,
    webui,
)
from ember.server.browser import LOOPBACK_ORIGIN, HostCheckMiddleware, OriginCheckMiddleware
from ember.server.config import ServerConfig
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, dumps, internal_error, json_response
from ember.server.metrics import CONTENT_TYPE
from ember.server.protocol import Fields, parse_messages

log = logging.getLogger("ember.server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})  # "/": the chat page (no data)


# --- routes ------------------------------------------------------------------------------------

Handler = Callable[[Request, AppContext], Awaitable[Response]]


def _route(path: str, handler: Handler, methods: list[str]) -> Route:
    async def endpoint(request: Request) -> Response:
        ctx: AppContext = request.app.state.ctx
        try:
            return await handler(request, ctx)
        except APIError as err:
            return err.response()
        except ClientDisconnect:
            log.info("%s %s: the client disconnected before its request body was complete",
                     request.method, request.url.path)
            return Response(status_code=499)  # nobody reads it
        except Exception:
            log.exception("bug while handling %s %s", request.method, request.url.path)
            return internal_error().response()

    return Route(path, endpoint, methods=methods)


async def health(request: Request, ctx: AppContext) -> Response:
    status, message = ctx.health()
    if status == "ok":
        return json_response({"status": "ok"})
    code = "shutting_down" if status == "shutting_down" else f"model_{status}"
    err = APIError(503, message, code=code)
    return json_response({"status": status, **err.body()}, 503, err.headers())


def _model_card(ctx: AppContext, name: str) -> dict[str, Any]:
    engine = ctx.require_ready()
    return {"id": name, "object": "model", "created": ctx.created,
            "owned_by": "ember",
            "meta": {"file": ctx.model_path.name, "n_ctx": engine.n_ctx,
                     "n_vocab": engine.n_vocab, "n_slots": engine.parallel}}


async def list_models(request: Request, ctx: AppContext) -> Response:
    ctx.require_ready()
    return json_response({"object": "list",
                          "data": [_model_card(ctx, name) for name in ctx.model_names]})


async def get_model(request: Request, ctx: AppContext) -> Response:
    ctx.require_ready()
    name = request.path_params["model"]
    path = ctx.model_path
    if name not in {*ctx.model_names, path.name, path.stem}:
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                       f"'{ctx.model_name}'", param="model", code="model_not_found")
    return json_response(_model_card(ctx, name if name in ctx.model_names else ctx.model_name))


async def metrics(request: Request, ctx: AppContext) -> Response:
    stats = ctx.engine.stats() if ctx.engine is not None else None
    memory = getattr(ctx.engine, "device_memory", None)
    return Response(ctx.metrics.render(stats, memory), media_type=CONTENT_TYPE)


async def slots(request: Request, ctx: AppContext) -> Response:
    """ember's slot view plus llama-server's fields (id_task, speculative, params, next_token);
    ?fail_on_no_slot=1 answers 503 when every slot is busy, as llama-server does."""
    engine = ctx.require_ready()
    views = ctx.slots.views
    if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(
            v.request is not None for v in views):
        raise APIError(503, "no slot is available", code="no_slot_available")
    params = llama_api.default_settings(ctx)
    out = []
    for view in views:
        slot = view.as_json(engine.n_ctx)
        out.append({**slot, "id_task": view.request.id if view.request is not None else -1,
                    "speculative": False, "params": params,
                    "next_token": {"has_next_token": view.request is not None,
                                   "has_new_line": False, "n_remain": -1,
                                   "n_decoded": slot["n_decoded"], "stopping_word": ""}})
    return json_response(out)


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
        tokens = await generation.encode_chat(ctx, messages, within_context=False)
    else:
        text = fields.string("content")
        if text is None:
            text = fields.string("prompt")
        if text is None:
            raise bad_request("send the text to tokenize as 'content' (or 'prompt'), or chat "
                              "'messages'", param="content", code="missing_required")
        tokens = await generation.tokenize_text(ctx, text, add_special, parse_special,
                                                param="content", within_context=False)
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


# llama-server's reranking routes (its aliases of /rerank).
RERANK_PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


def _routes(config: ServerConfig) -> list[Route]:
    routes = [_route("/", webui.index, ["GET"])] if config.webui else []
    routes += [
        _route("/health", health, ["GET"]),
        _route("/v1/health", health, ["GET"]),
        _route("/metrics", metrics, ["GET"]),
        _route("/slots", slots, ["GET"]),
        _route("/tokenize", tokenize, ["POST"]),
        _route("/detokenize", detokenize, ["POST"]),
        _route("/v1/completions", generation.completions, ["POST"]),
        # llama-server's own API; un-prefixed /completions is its alias of /completion there.
        _route("/completion", llama_api.completion, ["POST"]),
        _route("/completions", llama_api.completion, ["POST"]),
        _route("/infill", llama_api.infill, ["POST"]),
        _route("/apply-template", llama_api.apply_template, ["POST"]),
        _route("/props", llama_api.props, ["GET"]),
        _route("/v1/responses", responses_api.create, ["POST"]),
        _route("/v1/responses/{response_id}", responses_api.retrieve, ["GET"]),
        _route("/v1/messages", anthropic_api.messages, ["POST"]),
        _route("/v1/messages/count_tokens", anthropic_api.count_tokens, ["POST"]),
        # llama-server's native embeddings; un-prefixed /embeddings is its alias there.
        _route("/v1/embeddings", embeddings.embeddings, ["POST"]),
        _route("/embedding", embeddings.native_embedding, ["POST"]),
        _route("/embeddings", embeddings.native_embedding, ["POST"]),
        *(_route(path, rerank.rerank, ["POST"]) for path in RERANK_PATHS),
    ]
    # llama-server also answers these without the /v1 prefix; so do we.
    for prefix in ("/v1", ""):
        routes += [
            _route(f"{prefix}/chat/completions", generation.chat_completions, ["POST"]),
            _route(f"{prefix}/models", list_models, ["GET"]),
            _route(prefix + "/models/{model:path}", get_model, ["GET"]),
        ]
    return routes


# --- middleware and errors ---------------------------------------------------------------------

class APIKeyMiddleware:
    """Requires "Authorization: Bearer KEY" (or "x-api-key: KEY", as Anthropic's clients send
    it) on every path but PUBLIC_PATHS (constant-time comparison)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
            if name == b"x-api-key":
                given = value.strip()
                break
        if not hmac.compare_digest(given, self._key):
            message = ("a valid API key is required: send 'Authorization: Bearer KEY' (or "
                       "'x-api-key: KEY')" if
                       not given else "the API key is not valid")
            response = APIError(401, message, code="invalid_api_key").response()
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
        return APIError(404, message, code="not_found").response()
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return APIError(405, message, code="method_not_allowed").response()
    return APIError(exc.status_code, str(exc.detail)).response()


async def _bug(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware logs the traceback; the client gets no details.
    return internal_error().response()


def create_app(config: ServerConfig, make_engine: Callable[[], Engine] | None = None
               ) -> Starlette:
    """The server's ASGI app. The model loads in a thread once the server listens:
    `make_engine` (default: an ember.engine.Engine on config's model and sizes)."""
    ctx = AppContext(config, make_engine)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ctx.loop = asyncio.get_running_loop()
        threading.Thread(target=ctx.load, name="ember-load", daemon=True).start()
        try:
            yield
        finally:
            ctx.cancel_all()
            await asyncio.to_thread(ctx.close)

    middleware = [Middleware(HostCheckMiddleware, listen_host=config.host,
                             allowed=config.host_allow),
                  Middleware(OriginCheckMiddleware, allowed=config.cors_origins),
                  Middleware(CORSMiddleware, allow_origins=config.cors_origins,
                             allow_origin_regex=LOOPBACK_ORIGIN, allow_methods=["*"],
                             allow_headers=["*"], max_age=600)]
    if config.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=config.api_key))
    app = Starlette(routes=_routes(config), middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _bug})
    app.state.ctx = ctx
    return app
