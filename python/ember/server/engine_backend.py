"""EngineBackend: the GenerationBackend on the C++ continuous-batching engine (ember.engine).

One engine runs every request in shared batched steps over a paged KV cache with prefix
caching: `parallel` is the most sequences running at once, `kv_size` the KV pool in tokens.
Requests beyond `parallel` wait in the engine's queue; the server refuses (queue_full) when more
than `max_queue` would wait.

Each request's event fd is watched with loop.add_reader, so its TokenEvents are turned into
GenerationEvents on the event loop's thread by ember.engine's decoder (detokenizing, stop
strings, logprobs, usage with the prefix cache's cached_tokens) without a thread per request.
Cancelling a stream cancels the engine request, which frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from ember import _core
from ember.chat import ChatTemplate
from ember.server.backend import (
    BackendBase,
    BackendStats,
    GenerationEvent,
    GenerationFailed,
    GenerationRequest,
    GenerationStream,
    Health,
    SlotInfo,
    Unavailable,
)

log = logging.getLogger("ember.server")



@dataclass
class _Tracked:
    request: GenerationRequest
    stream: GenerationStream
    decoder: object            # ember.engine._Decoder
    fd: int
    slot: int | None = None    # the slot id it shows in /slots while it runs


@dataclass
class _SlotView:
    request_id: str | None = None
    n_prompt_tokens: int = 0
    n_decoded: int = 0
    n_cached_tokens: int = 0


class EngineBackend(BackendBase):
    """The continuous-batching engine behind the server. n_ctx per sequence: ctx_size, else the
    engine's default (the model's context, at most 4096)."""

    def __init__(self, model: str | os.PathLike[str] | None, *, parallel: int = 1,
                 ctx_size: int | None = None, kv_size: int | None = None,
                 threads: int | None = None, max_queue: int = 128, kv_type: str = "f16") -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        for name, value in (("ctx_size", ctx_size), ("kv_size", kv_size), ("threads", threads)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self._model_arg = model
        self._parallel = parallel
        self._ctx_size = ctx_size
        self._kv_size = kv_size
        self._kv_type = kv_type
        self._threads = threads
        self._max_queue = max_queue
        self._health = Health("loading", "the model is loading")
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine = None  # ember.engine.Engine
        self._path: Path | None = None
        self._template: ChatTemplate | None = None
        self._n_ctx = 0
        self._n_vocab = 0
        self._tracked: dict[int, _Tracked] = {}   # engine request id -> request
        self._slot_views = [_SlotView() for _ in range(parallel)]
        self._slot_owner: list[int | None] = [None] * parallel  # engine request id per slot
        self._closed = False

    # --- loading ---------------------------------------------------------------------------

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        from ember.engine import Engine
        from ember.hub import resolve_model

        self._loop = loop
        try:
            path = resolve_model(self._model_arg)
            engine = Engine(path, n_threads=self._threads, n_ctx=self._ctx_size,
                            parallel=self._parallel, kv_size=self._kv_size, max_queue=0,
                            kv_type=self._kv_type)
            self._template = ChatTemplate.from_gguf(path)
        except BaseException as err:
            self._health = Health("error", f"loading the model failed: {err}")
            raise
        self._engine = engine
        self._path = Path(path)
        self._n_ctx = engine.n_ctx
        self._n_vocab = engine.n_vocab
        log.info("loaded %s on the batching engine: %d sequence(s) at once, %d tokens each, "
                 "KV cache of %d tokens (%s)", self._path.name, self._parallel, self._n_ctx,
                 engine.core.kv_size, engine.core.kv_type)
        loop.call_soon_threadsafe(self._set_ready)

    def _require_tokenizer(self) -> _core.Tokenizer:
        if self._engine is None:
            raise Unavailable("the model is loading", "model_loading")
        return self._engine.tokenizer

    # --- admission (event loop thread) -------------------------------------------------------

    def submit(self, requests: Sequence[GenerationRequest]) -> list[GenerationStream]:
        from ember.engine import _Decoder, _empty_delta

        if self._health.status != "ok" or self._loop is None or self._engine is None:
            raise Unavailable(self._health.message or "the model is not ready", "model_loading")
        if not self._accepting:
            raise Unavailable("the server is shutting down", "shutting_down")
        engine = self._engine
        n_live = len(self._tracked)
        n_waiting = max(0, n_live - self._parallel)
        n_free = max(0, self._parallel - n_live)
        n_waiting_after = n_waiting + max(0, len(requests) - n_free)
        if n_waiting_after > self._max_queue:
            raise Unavailable(
                f"the server is busy: {n_waiting} requests are waiting and the queue holds "
                f"{self._max_queue} (--max-queue); retry later", "queue_full")
        submitted: list[tuple[GenerationRequest, object, float]] = []
        empty: dict[int, GenerationRequest] = {}
        try:
            for i, request in enumerate(requests):
                if request.params.max_tokens == 0:
                    empty[i] = request
                    continue
                handle, _tokens, start = engine.submit(request.prompt_tokens, request.params)
                submitted.append((request, handle, start))
        except Exception as err:
            for _, handle, _ in submitted:
                engine.cancel(handle.id)
            if isinstance(err, _core.EngineBusy):
                raise Unavailable("the server is busy; retry later", "queue_full") from None
            if isinstance(err, ValueError):
                raise GenerationFailed(str(err)) from None
            raise
        streams: list[GenerationStream] = []
        it = iter(submitted)
        for i, request in enumerate(requests):
            stream = GenerationStream(request.request_id, self._loop, self._on_cancel)
            streams.append(stream)
            if i in empty:
                delta = _empty_delta(list(request.prompt_tokens))
                stream.put(GenerationEvent("", [], [], "length", delta.result.usage))
                continue
            _, handle, start = next(it)
            decoder = _Decoder(engine, handle, list(request.prompt_tokens), request.params, start)
            fd = handle.fileno()
            tracked = _Tracked(request, stream, decoder, fd)
            stream._ember_engine_id = handle.id  # type: ignore[attr-defined]
            self._tracked[handle.id] = tracked
            self._assign_slot(handle.id, tracked)
            self._loop.add_reader(fd, self._on_ready, handle.id)
            self._on_ready(handle.id)  # events that came before the reader was added
        return streams

    # --- slots (bookkeeping for /slots; the engine schedules by itself) ----------------------

    def _assign_slot(self, engine_id: int, tracked: _Tracked) -> None:
        for slot, owner in enumerate(self._slot_owner):
            if owner is None:
                self._slot_owner[slot] = engine_id
                tracked.slot = slot
                view = self._slot_views[slot]
                view.request_id = tracked.request.request_id
                view.n_prompt_tokens = len(tracked.request.prompt_tokens)
                view.n_decoded = 0
                view.n_cached_tokens = 0
                return

    def _release(self, engine_id: int) -> None:
        tracked = self._tracked.pop(engine_id, None)
        if tracked is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):  # the loop is going away
                self._loop.remove_reader(tracked.fd)
        if tracked.slot is not None:
            self._slot_owner[tracked.slot] = None
            view = self._slot_views[tracked.slot]
            view.n_cached_tokens = view.n_prompt_tokens + view.n_decoded
            # Hand the slot to the oldest request still without one.
            for other_id, other in self._tracked.items():
                if other.slot is None:
                    self._assign_slot(other_id, other)
                    break

    # --- events (event loop thread) ----------------------------------------------------------

    def _on_ready(self, engine_id: int) -> None:
        from ember.engine import EngineError

        tracked = self._tracked.get(engine_id)
        if tracked is None:
            return
        decoder = tracked.decoder
        events = decoder.handle.drain()  # type: ignore[attr-defined]
        if not events:
            return
        try:
            for delta in decoder.feed(events):  # type: ignore[attr-defined]
                usage = delta.result.usage if delta.result is not None else None
                tracked.stream.put(GenerationEvent(
                    text=delta.text, token_ids=list(delta.tokens),
                    logprobs=list(delta.logprobs), finish_reason=delta.finish_reason,
                    usage=usage))
        except EngineError as err:
            log.error("request %s failed in the engine: %s", tracked.request.request_id, err)
            tracked.stream.fail(GenerationFailed(f"generation failed: {err}"))
            self._release(engine_id)
            return
        if tracked.slot is not None:
            view = self._slot_views[tracked.slot]
            view.n_decoded = len(decoder.tokens)  # type: ignore[attr-defined]
        if decoder.done:  # type: ignore[attr-defined]
            self._release(engine_id)

    def _on_cancel(self, stream: GenerationStream) -> None:
        engine_id = getattr(stream, "_ember_engine_id", None)
        if engine_id is None or self._engine is None:
            return
        self._engine.cancel(engine_id)  # frees its KV blocks; the 'cancelled' event is dropped
        self._release(engine_id)

    # --- introspection -------------------------------------------------------------------------

    def slots(self) -> list[SlotInfo]:
        return [SlotInfo(
            id=i, is_processing=self._slot_owner[i] is not None, request_id=view.request_id,
            n_ctx=self._n_ctx, n_prompt_tokens=view.n_prompt_tokens, n_decoded=view.n_decoded,
            n_cached_tokens=view.n_cached_tokens,
        ) for i, view in enumerate(self._slot_views)]

    def stats(self) -> BackendStats:
        if self._engine is None:
            return BackendStats(0, 0, 0.0)
        s = self._engine.core.stats()
        return BackendStats(n_running=int(s["running"]), n_waiting=int(s["waiting"]),
                            kv_cache_usage=min(1.0, max(0.0, float(s["kv_usage"]))))

    # --- shutdown ------------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        self._accepting = False

    def cancel_all(self, reason: str) -> None:
        for engine_id, tracked in list(self._tracked.items()):
            if self._engine is not None:
                self._engine.cancel(engine_id)
            tracked.stream.fail(Unavailable(reason, "shutting_down"))
            self._release(engine_id)

    def close(self, timeout: float) -> None:
        self._accepting = False
        if self._engine is not None and not self._closed:
            self._closed = True
            start = perf_counter()
            self._engine.close()
            log.debug("engine stopped in %.3fs", perf_counter() - start)

