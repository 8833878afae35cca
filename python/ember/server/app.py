"""The Starlette application: routes, API-key check, CORS, model loading and shutdown.

    app = create_app(ServerConfig(model="model.gguf", parallel=4))

The model loads in a background thread once the server listens: /health answers 503 while it
loads, then 200 {"status": "ok"}. Every route but /health needs the API key when one is set.
Unknown model names in requests are a 400 with code "model_not_found" (DESIGN.md: every client
mistake is a 400; OpenAI itself answers 404 there). A request may name the model by an alias,
the file name or the file name without .gguf; omitting `model` means the served model.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ember.server import generation
from ember.server.backend import GenerationBackend
from ember.server.config import ServerConfig
from ember.server.errors import APIError, bad_request, internal_error, json_response
from ember.server.metrics import CONTENT_TYPE, ServerMetrics
from ember.server.protocol import Fields, parse_messages

log = logging.getLogger("ember.server")

PUBLIC_PATHS = frozenset({"/health"})


class AppContext:
    """What the handlers share: the config, the backend, the metrics, the model's names."""

    def __init__(self, config: ServerConfig, backend: GenerationBackend) -> None:
        self.config = config
        self.backend = backend
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self.shutting_down = False
        self.load_failed = False
        self.on_load_error: Callable[[], None] | None = None

    # --- loading and shutdown ------------------------------------------------------------------

    def load(self) -> None:
        """Runs in a background thread: loads the model; on failure logs it and tells the
        runner (which stops the server)."""
        assert self.loop is not None
        try:
            self.backend.load(self.loop)
        except BaseException as err:  # noqa: BLE001 - reported, and the server stops
            self.load_failed = True
            log.error("could not load the model: %s", err)
            if self.on_load_error is not None:
                self.on_load_error()

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new requests; in-flight ones get shutdown_timeout seconds to
        finish, then are cancelled (an error event for streams, 503 for the others)."""
        if self.shutting_down or self.loop is None:
            return
        self.shutting_down = True
        self.backend.stop_accepting()
        log.info("shutting down: in-flight requests have %.0f s to finish",
                 self.config.shutdown_timeout)
        self.loop.call_later(self.config.shutdown_timeout, self.backend.cancel_all,
                             "the server is shutting down")

    # --- request helpers -----------------------------------------------------------------------

    def require_ready(self) -> GenerationBackend:
        if self.shutting_down:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        health = self.backend.health()
        if health.status != "ok":
            raise APIError(503, health.message or "the model is not ready",
                           code="model_loading" if health.status == "loading" else health.status)
        return self.backend

    @property
    def model_name(self) -> str:
        if self.config.aliases:
            return self.config.aliases[0]
        return Path(self.backend.model_path).name or "ember"

    def check_model(self, requested: str | None) -> str:
        """The name to answer with; a 400 when `requested` names another model."""
        if requested is None or requested == "":
            return self.model_name
        path = Path(self.backend.model_path)
        names = {*self.config.aliases, path.name, path.stem, self.model_name}
        if requested not in names:
            raise APIError(400, f"the model '{requested}' does not exist; this server serves "
                           f"'{self.model_name}' (see /v1/models)", param="model",
                           code="model_not_found")
        return self.model_name

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object: 413 past max_body_bytes, 400 when it is not JSON."""
        limit = self.config.max_body_bytes
        too_large = APIError(413, f"the request body is larger than {limit} bytes",
                             code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks), parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as err:
            raise bad_request(f"the request body is not valid JSON: {err}",
                              code="invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object", code="invalid_json")
        return body


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# --- routes ------------------------------------------------------------------------------------

Handler = Callable[[Request, AppContext], Awaitable[Response]]


def _route(path: str, handler: Handler, methods: list[str]) -> Route:
    async def endpoint(request: Request) -> Response:
        ctx: AppContext = request.app.state.ctx
        try:
            return await handler(request, ctx)
        except APIError as err:
            return err.response()
        except Exception:
            log.exception("bug while handling %s %s", request.method, request.url.path)
            return internal_error().response()

    return Route(path, endpoint, methods=methods)


async def health(request: Request, ctx: AppContext) -> Response:
    status = ctx.backend.health()
    if ctx.shutting_down:
        err = APIError(503, "the server is shutting down", code="shutting_down")
        return json_response({"status": "shutting_down", **err.body()}, 503)
    if status.status == "ok":
        return json_response({"status": "ok"})
    err = APIError(503, status.message or status.status, code=f"model_{status.status}")
    return json_response({"status": status.status, **err.body()}, 503)


def _model_card(ctx: AppContext) -> dict[str, Any]:
    backend = ctx.backend
    return {"id": ctx.model_name, "object": "model", "created": ctx.created,
            "owned_by": "ember",
            "meta": {"path": backend.model_path, "n_ctx": backend.n_ctx,
                     "n_vocab": backend.n_vocab, "n_slots": backend.n_slots}}


async def list_models(request: Request, ctx: AppContext) -> Response:
    ctx.require_ready()
    return json_response({"object": "list", "data": [_model_card(ctx)]})


async def get_model(request: Request, ctx: AppContext) -> Response:
    ctx.require_ready()
    name = request.path_params["model"]
    try:
        ctx.check_model(name)
    except APIError:
        raise APIError(404, f"the model '{name}' does not exist", param="model",
                       code="model_not_found") from None
    return json_response(_model_card(ctx))


async def metrics(request: Request, ctx: AppContext) -> Response:
    stats = ctx.backend.stats() if ctx.backend.health().status == "ok" else None
    return Response(ctx.metrics.render(stats), media_type=CONTENT_TYPE)


async def slots(request: Request, ctx: AppContext) -> Response:
    backend = ctx.require_ready()
    return json_response([{
        "id": s.id, "state": "processing" if s.is_processing else "idle",
        "is_processing": s.is_processing, "request_id": s.request_id, "n_ctx": s.n_ctx,
        "n_prompt_tokens": s.n_prompt_tokens, "n_decoded": s.n_decoded,
        "n_cached_tokens": s.n_cached_tokens,
    } for s in backend.slots()])


async def tokenize(request: Request, ctx: AppContext) -> Response:
    """llama-server's and vLLM's /tokenize: {"content" | "prompt": text} or {"messages": [...]}
    -> {"tokens", "count", "max_model_len"}. add_special (default true, as for /v1/completions
    prompts) and parse_special (default true); with_pieces gives {"id", "piece"} pairs."""
    body = await ctx.read_json(request)
    backend = ctx.require_ready()
    fields = Fields(body)
    add_special = fields.boolean("add_special",
                                 default=fields.boolean("add_special_tokens", default=True))
    parse_special = fields.boolean("parse_special", default=True)
    with_pieces = fields.boolean("with_pieces")
    if body.get("messages") is not None:
        messages = parse_messages(body)
        try:
            tokens = await backend.encode_chat(messages)
        except ValueError as err:
            raise bad_request(str(err), param="messages", code="invalid_messages") from None
    else:
        text = fields.string("content")
        if text is None:
            text = fields.string("prompt")
        if text is None:
            raise bad_request("send the text to tokenize as 'content' (or 'prompt'), or chat "
                              "'messages'", param="content", code="missing_required")
        tokens = await backend.tokenize(text, add_special, parse_special)
    out: list[Any] = list(tokens)
    if with_pieces:
        out = [{"id": t, "piece": backend.token_piece(t).decode("utf-8", errors="replace")}
               for t in tokens]
    return json_response({"tokens": out, "count": len(tokens), "max_model_len": backend.n_ctx})


async def detokenize(request: Request, ctx: AppContext) -> Response:
    body = await ctx.read_json(request)
    backend = ctx.require_ready()
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("'tokens' must be an array of token ids", param="tokens",
                          code="invalid_type")
    try:
        text = await backend.detokenize(tokens)
    except ValueError as err:
        raise bad_request(str(err), param="tokens", code="invalid_value") from None
    return json_response({"content": text})


def _routes() -> list[Route]:
    routes = [
        _route("/health", health, ["GET"]),
        _route("/metrics", metrics, ["GET"]),
        _route("/slots", slots, ["GET"]),
        _route("/tokenize", tokenize, ["POST"]),
        _route("/detokenize", detokenize, ["POST"]),
    ]
    # llama-server also answers without the /v1 prefix; so do we.
    for prefix in ("/v1", ""):
        routes += [
            _route(f"{prefix}/chat/completions", generation.chat_completions, ["POST"]),
            _route(f"{prefix}/completions", generation.completions, ["POST"]),
            _route(f"{prefix}/models", list_models, ["GET"]),
            _route(prefix + "/models/{model:path}", get_model, ["GET"]),
        ]
    return routes


# --- middleware and errors ---------------------------------------------------------------------

class APIKeyMiddleware:
    """Requires "Authorization: Bearer KEY" on every path but PUBLIC_PATHS (constant-time
    comparison)."""

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
        if not hmac.compare_digest(given, self._key):
            message = ("a valid API key is required: send 'Authorization: Bearer KEY'" if
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


def create_app(config: ServerConfig, backend: GenerationBackend | None = None) -> Starlette:
    """The server's ASGI app. `backend` defaults to config.backend on config's model: "engine"
    (EngineBackend, the continuous-batching engine) or "llm" (LLMBackend, one ember.LLM per
    slot)."""
    if backend is None:
        if config.backend == "llm":
            from ember.server.llm_backend import LLMBackend

            backend = LLMBackend(config.model, parallel=config.parallel, ctx_size=config.ctx_size,
                                 kv_size=config.kv_size, threads=config.threads,
                                 max_queue=config.max_queue)
        else:
            from ember.server.engine_backend import EngineBackend

            backend = EngineBackend(config.model, parallel=config.parallel, ctx_size=config.ctx_size,
                                    kv_size=config.kv_size, threads=config.threads,
                                    max_queue=config.max_queue, kv_type=config.kv_type)
    ctx = AppContext(config, backend)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ctx.loop = asyncio.get_running_loop()
        threading.Thread(target=ctx.load, name="ember-load", daemon=True).start()
        try:
            yield
        finally:
            ctx.shutting_down = True
            backend.stop_accepting()
            backend.cancel_all("the server is shutting down")
            await asyncio.to_thread(backend.close, 5.0)

    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.cors_origins,
                                     allow_methods=["*"], allow_headers=["*"]))
    if config.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=config.api_key))
    app = Starlette(routes=_routes(), middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _bug})
    app.state.ctx = ctx
    return app

