"""What the request handlers share (AppContext): the config, the served models (a
ModelRegistry, server/models.py) and, per request, the one it selected (its engine, chat
template, /slots view), the metrics, and the helpers every handler uses (readiness, model
names, reading a JSON body, running work beside the event loop). Handlers import this; it
imports no handler and calls none, so imports and calls point one way.

The engine is ember.engine.Engine — the public API, nothing of ember._core: `submit` (which
raises ValueError for a request that can never run and EngineBusy past --max-queue),
`tokenize`, `tokenizer`, `cancel`, `stats`, `close`, and the sizes n_ctx, n_vocab, parallel.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request as HTTPRequest

from ember import _core
from ember.chat.template import ChatTemplate
from ember.embeddings import Embedder
from ember.engine import Engine
from ember.server.config import ServerConfig
from ember.server.errors import APIError, bad_request
from ember.server.fim import FimTokens
from ember.server.metrics import ServerMetrics
from ember.server.models import LoadedModel, ModelEntry, ModelRegistry, served_models
from ember.server.prompt_bound import PromptBound
from ember.server.protocol import Defaults
from ember.server.response_store import ResponseStore
from ember.server.scoring import PromptScorer
from ember.server.slots import Slots

log = logging.getLogger("ember.server")

T = TypeVar("T")

# Bodies up to this size are parsed and validated on the event loop (well under 1 ms); larger
# ones in a worker thread, so a few 8 MiB bodies cannot stall /health or running streams.
INLINE_BODY_BYTES = 64 << 10
# json.loads holds the GIL for its whole run: 8 MiB of small values ("1,1,1,...") take 340 ms,
# a stall no worker thread avoids. Commas bound the number of values, so bodies with more than
# this many (262,144: 12 ms to parse at worst) are refused, after a 4 ms count, before parsing.
# Legit bodies stay far below: 64 prompts of 4096 token ids is 262,143 commas.
MAX_BODY_COMMAS = 1 << 18


def _below_the_engine() -> None:
    """Lowers the calling worker thread's CPU priority (Linux schedules threads one by one;
    elsewhere the setting would reach the whole process, the engine included, so it is left)."""
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
        except OSError:  # a sandbox that forbids it: the thread runs at normal priority
            pass


# The model the request being handled selected (by its body's `model` or ?model=): each request
# runs in its own asyncio task, whose copy of this variable no other request sees. Reading it
# is how one AppContext answers every request for the model that request named.
_SELECTED: ContextVar[_Selection | None] = ContextVar("ember_selected_model", default=None)


@dataclass
class _Selection:
    entry: ModelEntry
    held: bool  # acquired from the registry: released when the handler returns


class AppContext:
    """The server's state: the config, the models (a ModelRegistry), and per request the model
    it selected (engine, template, slots, ... below are that model's). With one model served,
    it loads once, in a thread, after the server listens (/health answers 503 until then);
    with several, each loads on first use (server/models.py)."""

    def __init__(self, config: ServerConfig, make_engine: Callable[[], Engine] | None = None
                 ) -> None:
        self.config = config
        self._make_engine: Callable[[Path | None], Engine] = (
            (lambda path: make_engine()) if make_engine is not None else self._load_engine)
        self.models = ModelRegistry(served_models(config), self._load_model,
                                    config.engine_options, config.keep_alive_seconds,
                                    config.max_memory)
        self.responses = ResponseStore()       # /v1/responses created with store: true
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self.load_error: str | None = None     # the single model's start-up load failed
        self._first_load_done = False          # the single model's start-up load has ended
        self.shutting_down = False
        self.on_load_error: Callable[[], None] | None = None
        self._worker_lock: asyncio.Lock | None = None  # see in_worker
        # Tokenizing long texts runs here, below the engine's priority (see in_background).
        self._workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ember-request",
                                           initializer=_below_the_engine)

    # --- loading and shutdown ------------------------------------------------------------------

    @property
    def single(self) -> bool:
        """One model served: it loads at start-up and answers to any name."""
        return len(self.models.entries) == 1

    def _load_engine(self, path: Path | None) -> Engine:
        from ember.hub.models import resolve_model

        c = self.config
        return Engine(resolve_model(str(path) if path is not None else None), c.engine_options(),
                      chat_template=c.chat_template)

    def _load_model(self, path: Path | None) -> LoadedModel:
        """Loads one model (in a worker thread); raises what went wrong."""
        c = self.config
        if c.embedding and self._serves_encoder(path):  # an encoder: the embedder alone
            from ember.hub.models import resolve_model

            embedder = self._make_embedder(resolve_model(str(path) if path else None))
            return LoadedModel(embedder.path, None, embedder=embedder, slots=Slots(c.parallel))
        engine: Engine | None = None
        try:
            engine = self._make_engine(path)
            template = engine.chat_template  # read (and compiled) now: a bad one fails the load
            # Rendered once under the limits (1 s, 1 M characters): a template that loops,
            # recurses or builds huge strings fails here, visibly, not on the first request.
            template.check()
            bound = PromptBound.of(engine)
            fim = FimTokens.of(_core.GGUFFile(str(engine.path)).metadata) \
                if engine.path.is_file() else None
            # --embedding with a decoder: its embeddings beside chat (llama-server's), from an
            # Embedder of the same file (its own scratch, cache and copy of repacked weights).
            embedder = self._make_embedder(engine.path) if c.embedding else None
        except BaseException:
            if engine is not None:
                engine.close()
            raise
        log.info("loaded %s: %d request(s) at once, %d tokens each, KV cache of %d tokens (%s)",
                 engine.path.name, engine.parallel, engine.n_ctx, engine.kv_size, engine.kv_type)
        return LoadedModel(engine.path, engine, template, bound, fim, embedder, Slots(c.parallel))

    def load(self) -> None:
        """Runs in a background thread at start-up with one model served: loads it; on failure
        logs it and tells the runner (which stops the server)."""
        assert self.loop is not None
        entry = self.models.entries[0]
        try:
            loaded = self._load_model(entry.model.path)
        except BaseException as err:  # noqa: BLE001 - reported, and the server stops
            self._load_failed(err)
            return
        self.loop.call_soon_threadsafe(self._set_loaded, entry, loaded)

    def _serves_encoder(self, path: Path | None) -> bool:
        """Is the model an encoder (which only embeds)? False when it cannot be told here:
        the engine's load then reports the problem."""
        from ember.embeddings import is_embedding_model
        from ember.hub.models import resolve_model

        try:
            return is_embedding_model(resolve_model(str(path) if path is not None else None))
        except Exception:  # noqa: BLE001 - a missing or bad file fails the load itself
            return False

    def _make_embedder(self, path: Path) -> Embedder:
        c = self.config
        embedder = Embedder(path, n_threads=c.threads, device=c.device, pooling=c.pooling)
        if c.rerank and not embedder.is_reranker:
            raise ValueError(f"{path.name} is not a reranking model (--rerank serves a model with "
                             "a classification head: a cross-encoder such as a converted "
                             "BertForSequenceClassification, or a decoder classifier such as "
                             "Qwen3ForSequenceClassification)")
        if c.rerank and embedder.pooling not in ("cls", "rank"):
            raise ValueError(f"--rerank reads the state a reranker's head reads (pooling rank), "
                             f"but {path.name} pools {embedder.pooling}")
        log.info("%s embeds: %d dimensions, pooling %s, inputs of up to %d tokens",
                 path.name, embedder.n_embd, embedder.pooling, embedder.max_tokens)
        return embedder

    def _load_failed(self, err: BaseException) -> None:
        self.load_error = f"loading the model failed: {err}"
        self._first_load_done = True
        log.error("could not load the model: %s", err)
        if self.on_load_error is not None:
            self.on_load_error()

    def _set_loaded(self, entry: ModelEntry, loaded: LoadedModel) -> None:
        self.models.set_loaded(entry, loaded)
        self._first_load_done = True

    def begin_shutdown(self) -> None:
        """SIGTERM: refuse new requests; in-flight ones get shutdown_timeout seconds to
        finish, then are cancelled (an error event for streams, 503 for the others)."""
        if self.shutting_down or self.loop is None:
            return
        self.shutting_down = True
        log.info("shutting down: in-flight requests have %.0f s to finish",
                 self.config.shutdown_timeout)
        self.loop.call_later(self.config.shutdown_timeout, self.cancel_all)

    def cancel_all(self) -> None:
        """Ends every live request; their handlers answer 503 (or an SSE error event)."""
        self.shutting_down = True
        for entry in self.models.entries:
            loaded = entry.loaded
            if loaded is not None and loaded.engine is not None:
                for request in list(loaded.slots.live):
                    loaded.engine.cancel(request.id)

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        self.models.close()

    # --- the model a request selected ----------------------------------------------------------

    async def select(self, name: Any) -> None:
        """Makes the model `name` selects (models.resolve: 404 for none, 400 when several are
        served and it is missing) this request's, loading it if need be, and holds it against
        unloading until the handler returns (release_selection)."""
        entry = self.models.resolve(name)
        self.release_selection()
        if self.single and not self._first_load_done:
            _SELECTED.set(_Selection(entry, held=False))  # require_ready says "loading"
            return
        if self.shutting_down:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        await self.models.acquire(entry)
        _SELECTED.set(_Selection(entry, held=True))

    def release_selection(self) -> None:
        """Ends the hold of select(); the selection itself stays for the response's stream,
        whose running requests (in the model's slots) keep the model from unloading."""
        selection = _SELECTED.get()
        if selection is not None and selection.held:
            self.models.release(selection.entry)
            selection.held = False

    @property
    def selected(self) -> ModelEntry | None:
        """The request's model: the one selected, else the only one served (else None)."""
        selection = _SELECTED.get()
        if selection is not None:
            return selection.entry
        return self.models.entries[0] if self.single else None

    @property
    def loaded(self) -> LoadedModel | None:
        entry = self.selected
        return entry.loaded if entry is not None else None

    @property
    def engine(self) -> Engine | None:
        loaded = self.loaded
        return loaded.engine if loaded is not None else None

    @property
    def embedder(self) -> Embedder | None:
        """With config.embedding: an encoder's, instead of the engine; a decoder's, beside it."""
        loaded = self.loaded
        return loaded.embedder if loaded is not None else None

    @property
    def template(self) -> ChatTemplate | None:
        loaded = self.loaded
        return loaded.template if loaded is not None else None

    @property
    def bound(self) -> PromptBound | None:
        loaded = self.loaded
        return loaded.bound if loaded is not None else None

    @property
    def fim(self) -> FimTokens | None:
        loaded = self.loaded
        return loaded.fim if loaded is not None else None

    @property
    def slots(self) -> Slots:
        loaded = self.loaded
        return loaded.slots if loaded is not None else Slots(self.config.parallel)

    # --- request helpers -----------------------------------------------------------------------

    def require_ready(self) -> Engine:
        if self.shutting_down:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        entry = self.selected
        if entry is None:
            self.models.resolve(None)  # several models and none named: the 400 naming them
        assert entry is not None
        loaded = entry.loaded
        if loaded is not None and loaded.engine is None:
            raise APIError(400, "this server serves an encoder, an embedding model (ember serve "
                           "--embedding): only /v1/embeddings, /embedding and (for a reranking "
                           "model, with --rerank) /rerank answer", code="not_supported")
        if loaded is None or loaded.engine is None:
            if self.load_error:
                raise APIError(503, self.load_error, code="model_error")
            raise APIError(503, "the model is loading", code="model_loading")
        return loaded.engine

    def health(self) -> tuple[str, str]:
        """(status, message): "ok", "loading", "error" or "shutting_down". With several models
        the server is "ok" once it listens: each model loads on first use."""
        if self.shutting_down:
            return "shutting_down", "the server is shutting down"
        if not self.single or self._first_load_done and not self.load_error:
            return "ok", ""
        if self.load_error:
            return "error", self.load_error
        return "loading", "the model is loading"

    @property
    def scorer(self) -> PromptScorer:
        """Scores prompts (echo + logprobs); its model loads on first use."""
        engine = self.require_ready()
        loaded = self.loaded
        assert loaded is not None
        if loaded.scorer is None:
            loaded.scorer = PromptScorer(engine.path, self.config.threads, engine.n_ctx,
                                         engine.tokenizer)
        return loaded.scorer

    @property
    def model_path(self) -> Path:
        loaded, entry = self.loaded, self.selected
        if loaded is not None:
            return loaded.path
        if entry is not None and entry.model.files:
            return entry.model.path
        return Path(self.config.model or "")

    @property
    def model_name(self) -> str:
        """The id answers carry: with one model, the first --alias, else its file name; with
        several, the name the request selected."""
        if not self.single:
            entry = self.selected
            return entry.name if entry is not None else "ember"
        if self.config.aliases:
            return self.config.aliases[0]
        return self.model_path.name or "ember"

    @property
    def model_names(self) -> list[str]:
        """/v1/models' ids: the served model's, then the other names of --alias; with several
        models, every model's name."""
        if not self.single:
            return self.models.names
        return [self.model_name, *[a for a in self.config.aliases if a != self.model_name]]

    @property
    def defaults(self) -> Defaults:
        """What requests get for the fields they omit (--n-predict, --temp, ...)."""
        c, engine = self.config, self.engine
        tokenize = None if engine is None else (
            lambda text: list(engine.tokenizer.encode(text, False, False)))
        return Defaults(n_predict=c.n_predict, sampling=c.sampling, n_slots=c.parallel,
                        max_n=c.max_n, tokenize=tokenize, json_bounds=c.json_bounds)

    async def offload(self, request: HTTPRequest, work: Callable[..., T], *args: Any,
                      **kwargs: Any) -> T:
        """work(*args, **kwargs) on the loop for a small body, in a worker thread for a large
        one (what read_json saw)."""
        if getattr(request.state, "body_bytes", 0) <= INLINE_BODY_BYTES:
            return work(*args, **kwargs)
        return await self.in_worker(work, *args, **kwargs)

    async def in_worker(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """work(*args, **kwargs) in a worker thread, one such job at a time. The jobs (json.loads, UTF-8
        checks, template rendering, serializing) hold the GIL for up to ~15 ms in C calls that
        never let go; several at once would queue the event loop behind all of them, one at a
        time keeps its wait to about one."""
        if self._worker_lock is None:
            self._worker_lock = asyncio.Lock()
        async with self._worker_lock:
            return await asyncio.to_thread(work, *args, **kwargs)

    async def in_background(self, work: Callable[..., T], *args: Any) -> T:
        """work(*args), a C++ call that releases the GIL (tokenizing a long text), in a worker
        thread at a lower CPU priority than the engine: on a machine whose cores the engine's
        threads already fill, it takes the time the engine leaves, not a core from every
        running stream. Never for work that holds the GIL: descheduled behind the engine, such
        a thread would keep the event loop waiting for the GIL."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._workers, functools.partial(work, *args))

    async def read_json(self, request: HTTPRequest, *, top: type = dict) -> Any:
        """The body as a JSON object (`top=list`: an array): 413 past max_body_bytes, 400 when
        it is not JSON (or nested deeper than the parser's recursion limit)."""
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            shown = f"'{media_type[:100]}'" if media_type else "none"
            raise APIError(415, f"the request body must be sent as Content-Type: application/json "
                           f"(got {shown}); with curl: -H 'Content-Type: application/json'",
                           code="unsupported_media_type")
        limit = self.config.max_body_bytes
        too_large = APIError(413, f"the request body is larger than {limit} bytes",
                             code="request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        timeout = self.config.body_timeout
        try:
            chunks, size = await asyncio.wait_for(_read_body(request, too_large, limit), timeout)
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {timeout:g} s "
                           "(--body-timeout)", code="request_timeout") from None
        request.state.body_bytes = size
        body = await self.offload(request, _parse_json, chunks, size)
        if not isinstance(body, top):
            raise bad_request(f"the request body must be a JSON {'object' if top is dict else 'array'}",
                              code="invalid_json")
        # The model the body names (else ?model=, llama-server's router) answers the request.
        name = body.get("model") if isinstance(body, dict) else None
        await self.select(name if name is not None else request.query_params.get("model"))
        return body


async def _read_body(request: HTTPRequest, too_large: APIError, limit: int
                     ) -> tuple[list[bytes], int]:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return chunks, size


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _parse_json(chunks: list[bytes], size: int) -> Any:
    raw = b"".join(chunks)
    if size > INLINE_BODY_BYTES and (n_commas := raw.count(b",")) > MAX_BODY_COMMAS:
        raise APIError(413, f"the request body holds {n_commas} commas (JSON values); at most "
                       f"{MAX_BODY_COMMAS} are accepted, as parsing more would stall the server",
                       code="request_too_large")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise bad_request(f"the request body is not valid JSON: {err}",
                          code="invalid_json") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply (arrays and objects within "
                          "each other beyond the parser's limit of about 1000 levels)",
                          code="invalid_json") from None
