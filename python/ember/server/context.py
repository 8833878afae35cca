"""What the request handlers share (AppContext): the config, the engine once it is loaded, the
chat template, the metrics, the /slots view, and the helpers every handler uses (readiness,
model names, reading a JSON body, running work beside the event loop). Handlers import this;
it imports no handler and calls none, so imports and calls point one way.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request as HTTPRequest

from ember import _core
from ember.chat.template import ChatTemplate
from ember.embeddings import Embedder
from ember.engine import Engine, Request
from ember.server.config import ServerConfig
from ember.server.errors import APIError, bad_request
from ember.server.fim import FimTokens
from ember.server.lora import LoraTable
from ember.server.metrics import ServerMetrics
from ember.server.prompt_bound import PromptBound
from ember.server.protocol import Defaults
from ember.server.response_store import ResponseStore
from ember.server.scoring import PromptScorer

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


@dataclass
class SlotView:
    """One of the `parallel` places a request runs in, llama-server's /slots style."""

    id: int
    request: Request | None = None   # the request it runs now
    request_id: str | None = None    # the HTTP-level id of that (or the last) request
    n_prompt_tokens: int = 0
    n_decoded: int = 0
    n_cached_tokens: int = 0         # tokens whose KV the slot left for prefix reuse

    def as_json(self, n_ctx: int) -> dict[str, Any]:
        busy = self.request is not None
        n_decoded = len(self.request.tokens) if self.request is not None else self.n_decoded
        return {"id": self.id, "state": "processing" if busy else "idle", "is_processing": busy,
                "request_id": self.request_id, "n_ctx": n_ctx,
                "n_prompt_tokens": self.n_prompt_tokens, "n_decoded": n_decoded,
                "n_cached_tokens": self.n_cached_tokens}


class Slots:
    """Which live request shows in which slot (bookkeeping for /slots and for shutdown; the
    engine schedules by itself). Requests beyond `parallel` wait for a slot in arrival order."""

    def __init__(self, n_slots: int) -> None:
        self.views = [SlotView(i) for i in range(n_slots)]
        self.live: dict[Request, str] = {}  # every unfinished request -> its HTTP-level id

    def add(self, request: Request, request_id: str) -> None:
        self.live[request] = request_id
        self._assign(request, request_id)

    def remove(self, request: Request) -> None:
        if self.live.pop(request, None) is None:
            return
        for view in self.views:
            if view.request is request:
                view.request = None
                view.n_decoded = len(request.tokens)
                view.n_cached_tokens = view.n_prompt_tokens + view.n_decoded
                waiting = [r for r in self.live if not any(v.request is r for v in self.views)]
                if waiting:
                    self._assign(waiting[0], self.live[waiting[0]])
                return

    def _assign(self, request: Request, request_id: str) -> None:
        for view in self.views:
            if view.request is None:
                view.request, view.request_id = request, request_id
                view.n_prompt_tokens, view.n_decoded = len(request.prompt_tokens), 0
                view.n_cached_tokens = 0
                return


def _below_the_engine() -> None:
    """Lowers the calling worker thread's CPU priority (Linux schedules threads one by one;
    elsewhere the setting would reach the whole process, the engine included, so it is left)."""
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
        except OSError:  # a sandbox that forbids it: the thread runs at normal priority
            pass


class AppContext:
    """The server's state. `make_engine` loads the model (called once, in a thread, after the
    server listens); /health answers 503 until it returns."""

    def __init__(self, config: ServerConfig, make_engine: Callable[[], Engine] | None = None
                 ) -> None:
        self.config = config
        self.make_engine = make_engine or self._load_engine
        self.engine: Engine | None = None
        # With config.embedding: an encoder's, instead of the engine; a decoder's, beside it.
        self.embedder: Embedder | None = None
        self.template: ChatTemplate | None = None
        self.bound: PromptBound | None = None  # the bounded-cost context check, set at load
        self.fim: FimTokens | None = None      # the model's infill tokens, if it has them
        self._scorer: PromptScorer | None = None
        self.responses = ResponseStore()       # /v1/responses created with store: true
        self.metrics = ServerMetrics()
        self.slots = Slots(config.parallel)
        # The LoRA adapters and their global scales (POST /lora-adapters; 0 at start).
        self.lora = LoraTable(tuple(config.lora), tuple(config.lora.values()),
                              (0.0,) * len(config.lora))
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self.load_error: str | None = None
        self.shutting_down = False
        self.on_load_error: Callable[[], None] | None = None
        self._worker_lock: asyncio.Lock | None = None  # see in_worker
        # Tokenizing long texts runs here, below the engine's priority (see in_background).
        self._workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ember-request",
                                           initializer=_below_the_engine)

    # --- loading and shutdown ------------------------------------------------------------------

    def _load_engine(self) -> Engine:
        from ember.hub.models import resolve_model

        c = self.config
        return Engine(resolve_model(c.model), c.engine_options(), chat_template=c.chat_template,
                      lora=c.lora)

    def load(self) -> None:
        """Runs in a background thread: loads the model; on failure logs it and tells the
        runner (which stops the server)."""
        assert self.loop is not None
        if self.config.embedding and self._serves_encoder():
            return self._load_embedder()
        engine: Engine | None = None
        try:
            engine = self.make_engine()
            template = engine.chat_template  # read (and compiled) now: a bad one fails the load
            # Rendered once under the limits (1 s, 1 M characters): a template that loops,
            # recurses or builds huge strings fails here, visibly, not on the first request.
            template.check()
            bound = PromptBound.of(engine)
            fim = FimTokens.of(_core.GGUFFile(str(engine.path)).metadata) \
                if engine.path.is_file() else None
            # --embedding with a decoder: its embeddings beside chat (llama-server's), from an
            # Embedder of the same file (its own scratch, cache and copy of repacked weights).
            embedder = self._make_embedder(engine.path) if self.config.embedding else None
        except BaseException as err:  # noqa: BLE001 - reported, and the server stops
            if engine is not None:
                engine.close()
            self._load_failed(err)
            return
        log.info("loaded %s: %d request(s) at once, %d tokens each, KV cache of %d tokens (%s)",
                 engine.path.name, engine.parallel, engine.n_ctx, engine.kv_size, engine.kv_type)
        self.loop.call_soon_threadsafe(self._set_loaded, engine, template, bound, fim, embedder)

    def _serves_encoder(self) -> bool:
        """Is the model an encoder (which only embeds)? False when it cannot be told here:
        the engine's load then reports the problem."""
        from ember.embeddings import is_embedding_model
        from ember.hub.models import resolve_model

        try:
            return is_embedding_model(resolve_model(self.config.model))
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
        log.error("could not load the model: %s", err)
        if self.on_load_error is not None:
            self.on_load_error()

    def _load_embedder(self) -> None:
        """An encoder: the embedder alone."""
        from ember.hub.models import resolve_model

        assert self.loop is not None
        try:
            embedder = self._make_embedder(resolve_model(self.config.model))
        except BaseException as err:  # noqa: BLE001 - reported, and the server stops
            self._load_failed(err)
            return
        self.loop.call_soon_threadsafe(setattr, self, "embedder", embedder)

    def _set_loaded(self, engine: Engine, template: ChatTemplate, bound: PromptBound,
                    fim: FimTokens | None, embedder: Embedder | None) -> None:
        self.engine, self.template, self.bound, self.fim = engine, template, bound, fim
        self.embedder = embedder

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
        if self.engine is not None:
            for request in list(self.slots.live):
                self.engine.cancel(request.id)

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None:
            self.engine.close()

    # --- request helpers -----------------------------------------------------------------------

    def require_ready(self) -> Engine:
        if self.shutting_down:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.embedder is not None and self.engine is None:
            raise APIError(400, "this server serves an encoder, an embedding model (ember serve "
                           "--embedding): only /v1/embeddings, /embedding and (for a reranking "
                           "model, with --rerank) /rerank answer", code="not_supported")
        if self.engine is None:
            if self.load_error:
                raise APIError(503, self.load_error, code="model_error")
            raise APIError(503, "the model is loading", code="model_loading")
        return self.engine

    def health(self) -> tuple[str, str]:
        """(status, message): "ok", "loading", "error" or "shutting_down"."""
        if self.shutting_down:
            return "shutting_down", "the server is shutting down"
        if self.engine is not None or self.embedder is not None:
            return "ok", ""
        if self.load_error:
            return "error", self.load_error
        return "loading", "the model is loading"

    @property
    def scorer(self) -> PromptScorer:
        """Scores prompts (echo + logprobs); its model loads on first use."""
        engine = self.require_ready()
        if self._scorer is None:
            self._scorer = PromptScorer(engine.path, self.config.threads, engine.n_ctx,
                                        engine.tokenizer)
        return self._scorer

    @property
    def model_path(self) -> Path:
        if self.embedder is not None and self.engine is None:
            return self.embedder.path
        return Path(self.engine.path if self.engine is not None else self.config.model or "")

    @property
    def model_name(self) -> str:
        if self.config.aliases:
            return self.config.aliases[0]
        return self.model_path.name or "ember"

    @property
    def model_names(self) -> list[str]:
        """The served model's id, then the other names of --alias (listed in /v1/models)."""
        names = [self.model_name, *[a for a in self.config.aliases if a != self.model_name]]
        return names + [f"{self.model_name}:{adapter}" for adapter in self.lora.names]

    def set_lora_scales(self, scales: list[float]) -> None:
        self.lora = replace(self.lora, scales=tuple(scales))

    @property
    def defaults(self) -> Defaults:
        """What requests get for the fields they omit (--n-predict, --temp, ...)."""
        c, engine = self.config, self.engine
        tokenize = None if engine is None else (
            lambda text: list(engine.tokenizer.encode(text, False, False)))
        return Defaults(n_predict=c.n_predict, sampling=c.sampling, n_slots=c.parallel,
                        max_n=c.max_n, tokenize=tokenize, lora=self.lora)

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
