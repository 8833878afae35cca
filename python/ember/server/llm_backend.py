"""LLMBackend: the GenerationBackend on ember.LLM (`ember serve --backend llm`); the default is
EngineBackend, on the continuous-batching engine.

Each of the `parallel` slots owns an ember.LLM (the weights stay in one shared file mapping;
each slot has its own KV cache of n_ctx tokens) and a worker thread that runs one request at a
time, checking for cancellation between tokens. There is no batching across slots: slots share
the CPU cores (threads per slot default to the physical cores divided among the slots).

All scheduling state (the waiting queue, which slot runs what) lives on the event loop's thread;
workers only generate and report back with call_soon_threadsafe. A waiting request goes to the
idle slot whose cached tokens share the longest prefix with its prompt, so multi-turn chats and
shared system prompts reuse that slot's KV cache (ember.LLM evaluates only the new tokens).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from ember.llm import LLM

log = logging.getLogger("ember.server")

# Texts longer than this are tokenized off the event loop (short ones cost less than a hop).


@dataclass
class _Job:
    request: GenerationRequest
    stream: GenerationStream
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Slot:
    id: int
    llm: LLM
    inbox: queue.SimpleQueue[_Job | None] = field(default_factory=queue.SimpleQueue)
    thread: threading.Thread | None = None
    job: _Job | None = None          # set and cleared on the event loop only
    last_request_id: str | None = None
    n_prompt_tokens: int = 0
    n_decoded: int = 0               # written by the worker, read by the loop (an int: atomic)
    cached_tokens: list[int] = field(default_factory=list)  # what its KV cache holds (about)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class LLMBackend(BackendBase):
    """`parallel` ember.LLM slots fed from one bounded FIFO queue of at most `max_queue`
    waiting requests. n_ctx per slot: ctx_size, else kv_size // parallel, else the model's
    (ember.LLM's default); with both, the smaller."""

    def __init__(self, model: str | os.PathLike[str] | None, *, parallel: int = 1,
                 ctx_size: int | None = None, kv_size: int | None = None,
                 threads: int | None = None, max_queue: int = 128) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        for name, value in (("ctx_size", ctx_size), ("kv_size", kv_size), ("threads", threads)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if kv_size is not None and kv_size < parallel:
            raise ValueError(f"kv_size ({kv_size}) must hold at least one token per slot "
                             f"(parallel = {parallel})")
        self._model_arg = model
        self._parallel = parallel
        self._ctx_size = ctx_size
        self._kv_size = kv_size
        self._threads = threads
        self._max_queue = max_queue
        self._health = Health("loading", "the model is loading")
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: list[_Slot] = []
        self._waiting: deque[_Job] = deque()
        self._path: Path | None = None
        self._tokenizer: _core.Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._n_ctx = 0
        self._n_vocab = 0

    # --- loading ---------------------------------------------------------------------------

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        from ember.hub import resolve_model
        from ember.llm import LLM

        self._loop = loop
        try:
            path = resolve_model(self._model_arg)
            n_ctx = self._ctx_size
            if self._kv_size is not None:
                per_slot = self._kv_size // self._parallel
                n_ctx = min(n_ctx, per_slot) if n_ctx is not None else per_slot
            first = LLM(path, n_threads=self._threads, n_ctx=n_ctx)
            threads = self._threads
            if threads is None and self._parallel > 1:
                # Slots run at the same time: divide the cores among them.
                threads = max(1, first.model.n_threads // self._parallel)
                first = LLM(path, n_threads=threads, n_ctx=n_ctx)
            llms = [first] + [LLM(path, n_threads=threads, n_ctx=n_ctx)
                              for _ in range(self._parallel - 1)]
            self._template = ChatTemplate.from_gguf(path)
        except BaseException as err:
            self._health = Health("error", f"loading the model failed: {err}")
            raise
        self._path = path
        self._tokenizer = first.tokenizer
        self._n_ctx = first.n_ctx
        self._n_vocab = first.n_vocab
        self._slots = [_Slot(i, llm) for i, llm in enumerate(llms)]
        for slot in self._slots:
            slot.thread = threading.Thread(target=self._work, args=(slot,),
                                           name=f"ember-slot-{slot.id}", daemon=True)
            slot.thread.start()
        log.info("loaded %s: %d slot(s) of %d tokens, %d thread(s) each", path.name,
                 self._parallel, self._n_ctx, first.model.n_threads)
        loop.call_soon_threadsafe(self._set_ready)

    def _require_tokenizer(self) -> _core.Tokenizer:
        if self._tokenizer is None:
            raise Unavailable("the model is loading", "model_loading")
        return self._tokenizer

    # --- admission and scheduling (event loop thread) ----------------------------------------

    def submit(self, requests: Sequence[GenerationRequest]) -> list[GenerationStream]:
        if self._health.status != "ok" or self._loop is None:
            raise Unavailable(self._health.message or "the model is not ready", "model_loading")
        if not self._accepting:
            raise Unavailable("the server is shutting down", "shutting_down")
        n_idle = sum(1 for slot in self._slots if slot.job is None)
        n_waiting_after = len(self._waiting) + max(0, len(requests) - n_idle)
        if n_waiting_after > self._max_queue:
            raise Unavailable(
                f"the server is busy: {len(self._waiting)} requests are waiting and the queue "
                f"holds {self._max_queue} (--max-queue); retry later", "queue_full")
        streams = []
        for request in requests:
            stream = GenerationStream(request.request_id, self._loop, self._on_cancel)
            self._waiting.append(_Job(request, stream))
            streams.append(stream)
        self._dispatch()
        return streams

    def _dispatch(self) -> None:
        while self._waiting:
            idle = [slot for slot in self._slots if slot.job is None]
            if not idle:
                return
            job = self._waiting.popleft()
            prompt = job.request.prompt_tokens
            slot = max(idle, key=lambda s: _common_prefix(s.cached_tokens, prompt))
            slot.job = job
            slot.last_request_id = job.request.request_id
            slot.n_prompt_tokens = len(prompt)
            slot.n_decoded = 0
            slot.inbox.put(job)

    def _on_cancel(self, stream: GenerationStream) -> None:
        for job in self._waiting:
            if job.stream is stream:
                self._waiting.remove(job)
                return
        for slot in self._slots:
            if slot.job is not None and slot.job.stream is stream:
                slot.job.cancelled.set()  # the worker stops before its next token

    def _slot_done(self, slot: _Slot) -> None:
        slot.job = None
        self._dispatch()

    # --- workers -------------------------------------------------------------------------------

    def _work(self, slot: _Slot) -> None:
        assert self._loop is not None
        while True:
            job = slot.inbox.get()
            if job is None:
                return
            try:
                self._run(slot, job)
            finally:
                loop_alive = self._call_on_loop(self._slot_done, slot)
            if not loop_alive:
                return  # the event loop is closed: the server has stopped

    def _call_on_loop(self, callback: Callable[[_Slot], None], slot: _Slot) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, slot)
        except RuntimeError:
            return False
        return True

    def _run(self, slot: _Slot, job: _Job) -> None:
        if job.cancelled.is_set():
            return
        prompt = job.request.prompt_tokens
        tokens: list[int] = []
        slot.cached_tokens = []  # unknown while the cache is being rewritten
        deltas = slot.llm.stream_deltas(prompt, job.request.params)
        try:
            for delta in deltas:
                tokens.extend(delta.tokens)
                slot.n_decoded = len(tokens)
                job.stream.put(GenerationEvent(
                    text=delta.text, token_ids=list(delta.tokens), logprobs=list(delta.logprobs),
                    finish_reason=delta.finish_reason,
                    usage=delta.result.usage if delta.result is not None else None))
                if job.cancelled.is_set():
                    break
        except Exception as err:  # a model failure: report it, keep the slot serving
            log.exception("request %s failed in slot %d", job.request.request_id, slot.id)
            job.stream.fail(GenerationFailed(f"generation failed: {err}"))
            return
        finally:
            deltas.close()
        slot.cached_tokens = prompt + tokens

    # --- introspection -------------------------------------------------------------------------

    def slots(self) -> list[SlotInfo]:
        return [SlotInfo(
            id=slot.id, is_processing=slot.job is not None, request_id=slot.last_request_id,
            n_ctx=self._n_ctx, n_prompt_tokens=slot.n_prompt_tokens, n_decoded=slot.n_decoded,
            n_cached_tokens=len(slot.cached_tokens),
        ) for slot in self._slots]

    def stats(self) -> BackendStats:
        running = [slot for slot in self._slots if slot.job is not None]
        used = sum(slot.n_prompt_tokens + slot.n_decoded if slot.job is not None
                   else len(slot.cached_tokens) for slot in self._slots)
        capacity = self._n_ctx * len(self._slots)
        return BackendStats(n_running=len(running), n_waiting=len(self._waiting),
                            kv_cache_usage=min(1.0, used / capacity) if capacity else 0.0)

    # --- shutdown ------------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        self._accepting = False

    def cancel_all(self, reason: str) -> None:
        while self._waiting:
            self._waiting.popleft().stream.fail(Unavailable(reason, "shutting_down"))
        for slot in self._slots:
            if slot.job is not None:
                slot.job.cancelled.set()
                slot.job.stream.fail(Unavailable(reason, "shutting_down"))

    def close(self, timeout: float) -> None:
        self._accepting = False
        for slot in self._slots:
            slot.inbox.put(None)
        deadline = time.monotonic() + timeout
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join(max(0.0, deadline - time.monotonic()))
