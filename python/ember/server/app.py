"""The Starlette application: the route table, the middleware and the model's lifetime.

    app = create_app(ServerConfig(model="model.gguf", parallel=4))

Each route's handler lives in the room that owns it: openai_api.py (chat completions,
completions), responses_api.py (OpenAI Responses), anthropic_api.py (Anthropic Messages),
llama_api.py (llama-server's native API), embeddings.py, rerank.py, tokens.py (tokenize),
info.py (health, models, metrics, slots), webui.py (the chat page). A handler translates its
API's request into one Generation (fields.py, protocol.py, prompts.py) that respond.py runs on
the engine; errors.py answers every error. One model loads in a background thread once the
server listens (/health answers 503 until then); of several, each loads on first use, in the
model a request's `model` selects (models.py). Every route but /health and the chat page
needs the API key when one is set (auth.py); every route needs a Host header that names this
server (browser.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from ember.engine import Engine
from ember.server import (
    anthropic_api,
    embeddings,
    info,
    llama_api,
    openai_api,
    rerank,
    responses_api,
    tokens,
    webui,
)
from ember.server.auth import APIKeyMiddleware
from ember.server.browser import CORSMiddleware, HostCheckMiddleware
from ember.server.config import ServerConfig
from ember.server.context import AppContext
from ember.server.errors import ErrorBody, Handler, bug, endpoint, http_error

GET, POST = ["GET"], ["POST"]

# (path, methods, handler). llama-server answers its OpenAI routes without the /v1 prefix too,
# un-prefixed /completions and /embeddings are its aliases of /completion and /embedding, and
# /rerank has three more spellings; ember answers them all.
ROUTES: list[tuple[str, list[str], Handler]] = [
    ("/health", GET, info.health),
    ("/v1/health", GET, info.health),
    ("/metrics", GET, info.metrics),
    ("/slots", GET, info.slots),
    ("/tokenize", POST, tokens.tokenize),
    ("/detokenize", POST, tokens.detokenize),
    ("/v1/completions", POST, openai_api.completions),
    ("/completion", POST, llama_api.completion),
    ("/completions", POST, llama_api.completion),
    ("/infill", POST, llama_api.infill),
    ("/apply-template", POST, llama_api.apply_template),
    ("/props", GET, llama_api.props),
    ("/lora-adapters", GET, llama_api.lora_adapters),
    ("/lora-adapters", POST, llama_api.set_lora_adapters),
    ("/v1/responses", POST, responses_api.create),
    ("/v1/responses/{response_id}", GET, responses_api.retrieve),
    ("/v1/embeddings", POST, embeddings.embeddings),
    ("/embedding", POST, embeddings.native_embedding),
    ("/embeddings", POST, embeddings.native_embedding),
    *((path, POST, rerank.rerank)
      for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")),
    *((prefix + path, methods, handler) for prefix in ("/v1", "") for path, methods, handler in (
        ("/chat/completions", POST, openai_api.chat_completions),
        ("/chat/completions/input_tokens", POST, openai_api.chat_input_tokens),
        ("/models", GET, info.list_models),
        ("/models/{model:path}", GET, info.get_model))),
]
# Routes whose errors have another API's shape.
ANTHROPIC_ROUTES: list[tuple[str, list[str], Handler]] = [
    ("/v1/messages", POST, anthropic_api.messages),
    ("/v1/messages/count_tokens", POST, anthropic_api.count_tokens),
]


# GET routes that answer for the server, not for one model: they read ?model= themselves, and
# never load a model.
_SERVER_ROUTES = (info.health, info.list_models, info.get_model, info.metrics, webui.index,
                  responses_api.retrieve)


def _selecting(handler: Handler) -> Handler:
    """handler, in the model its request selects: a body's `model` (AppContext.read_json), or a
    GET's ?model= (llama-server's router: /props?model=NAME); the model stays loaded at least
    until the handler returns (and while its requests run)."""
    async def run(request: HTTPRequest, ctx: AppContext) -> Response:
        try:
            if request.method == "GET" and handler not in _SERVER_ROUTES:
                await ctx.select(request.query_params.get("model"))
            return await handler(request, ctx)
        finally:
            ctx.release_selection()

    return run


def _routes(config: ServerConfig) -> list[Route]:
    def table(rows: list[tuple[str, list[str], Handler]], error_body: ErrorBody | None = None
              ) -> list[Route]:
        return [Route(path, endpoint(_selecting(handler), error_body), methods=methods)
                for path, methods, handler in rows]

    page = table([("/", GET, webui.index)]) if config.webui else []
    return page + table(ROUTES) + table(ANTHROPIC_ROUTES, anthropic_api.anthropic_error)


def create_app(config: ServerConfig, make_engine: Callable[[], Engine] | None = None
               ) -> Starlette:
    """The server's ASGI app. The model loads in a thread once the server listens:
    `make_engine` (default: an ember.engine.Engine on config's model and sizes)."""
    ctx = AppContext(config, make_engine)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ctx.loop = asyncio.get_running_loop()
        if ctx.single:  # one model: loaded now; several: each on first use
            threading.Thread(target=ctx.load, name="ember-load", daemon=True).start()
        ctx.models.start_keep_alive()
        try:
            yield
        finally:
            ctx.cancel_all()
            await asyncio.to_thread(ctx.close)

    middleware = [Middleware(HostCheckMiddleware, listen_host=config.host,
                             allowed=config.host_allow),
                  Middleware(CORSMiddleware, allowed=config.cors_origins)]
    if config.api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=config.api_key))
    app = Starlette(routes=_routes(config), middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: bug})
    app.state.ctx = ctx
    return app
