"""The path every API's generation endpoints share, after their request is translated: `respond`
submits one engine Request per choice and answers in the API's `Shape`, as JSON once every
choice has finished or as an event stream.

Until the first event arrives nothing is sent, so every failure up to then is a plain HTTP
error; after it, a failure becomes the Shape's error event (OpenAI: `data: {"error": ...}`
then `data: [DONE]`). A client that goes away (before or during the stream, or while waiting
for a non-streamed answer) cancels all its sequences. This module knows no API's fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ember.context_fit import Dropped
from ember.engine import EngineError, Request
from ember.results import Delta
from ember.sampling import SamplingParams
from ember.server.context import AppContext
from ember.server.errors import APIError, dumps, from_engine, internal_error, json_response

log = logging.getLogger("ember.server")

T = TypeVar("T")

# Why a stream can end early: the engine failed it, or the server is shutting down.
StreamError = (EngineError, APIError)


def _shutdown_error() -> APIError:
    return APIError(503, "the server is shutting down", code="shutting_down")


class ChoiceEvents:
    """The Deltas of a request's choices as (choice index, delta), in arrival order; None once
    every choice has finished. Feeds each choice's RequestTimer and keeps /slots up to date.
    A choice the engine cancelled (the server shutting down) raises a 503 APIError; one the
    engine failed raises EngineError."""

    def __init__(self, ctx: AppContext, requests: Sequence[Request], request_id: str,
                 arrival: float) -> None:
        self._ctx = ctx
        self._requests = list(requests)
        self._timers = [ctx.metrics.timer(arrival) for _ in requests]
        self._iters = [r.__aiter__() for r in requests]
        self._unfinished = set(range(len(requests)))
        for i, request in enumerate(requests):
            ctx.slots.add(request, f"{request_id}-{i}")
        self._queue: asyncio.Queue[tuple[int, Delta] | BaseException | None] = asyncio.Queue()
        self._n_open = len(requests)
        # One choice (the common case) is read directly; several are pumped into one queue.
        self._tasks = [] if len(requests) == 1 else [
            asyncio.create_task(self._pump(i)) for i in range(len(requests))]

    async def _read(self, index: int) -> Delta | None:
        try:
            delta = await self._iters[index].__anext__()
        except StopAsyncIteration:
            self._finished(index, "cancelled")
            return None
        except EngineError:
            self._finished(index, "error")
            raise
        if delta.finish_reason == "cancelled":
            self._finished(index, "cancelled")
            raise _shutdown_error()
        self._timers[index].on_event(delta)
        if delta.finish_reason is not None:
            self._finished(index, None)
        return delta

    def _finished(self, index: int, reason: str | None) -> None:
        """Choice `index` ended: with its last Delta (reason None), or cancelled or failed."""
        if index not in self._unfinished:
            return
        self._unfinished.discard(index)
        if reason is not None:
            self._timers[index].end(reason)
        self._ctx.slots.remove(self._requests[index])

    async def _pump(self, index: int) -> None:
        try:
            while (delta := await self._read(index)) is not None:
                self._queue.put_nowait((index, delta))
                if delta.finish_reason is not None:
                    break
        except StreamError as err:
            self._queue.put_nowait(err)
        finally:
            self._queue.put_nowait(None)

    async def next(self) -> tuple[int, Delta] | None:
        if not self._tasks:
            if self._n_open == 0:
                return None
            delta = await self._read(0)
            if delta is None or delta.finish_reason is not None:
                self._n_open = 0
            return (0, delta) if delta is not None else None
        while self._n_open:
            item = await self._queue.get()
            if item is None:
                self._n_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                return item
        return None

    def close(self) -> None:
        """Cancels what has not finished (the client is gone, or one choice failed)."""
        for task in self._tasks:
            task.cancel()
        for i in list(self._unfinished):
            self._requests[i].cancel()
            self._finished(i, "cancelled")


class _ClientGone(Exception):
    pass


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: HTTPRequest, work: Awaitable[T]) -> T:
    """`work`'s result, or _ClientGone when the client disconnects first (the request body
    must have been read already, so the next message can only be the disconnect)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise _ClientGone
    return task.result()


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that cancels the request's sequences however the stream
    ends: finished, failed, or the client gone (Starlette cancels the body iterator then)."""

    def __init__(self, content: AsyncIterator[bytes], events: ChoiceEvents,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no",
                                  **(headers or {})})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._events.close()

def _submit(ctx: AppContext, generation: Generation) -> list[Request]:
    """Queues every choice or none: a full queue is a 503 and cancels what was queued."""
    engine = ctx.require_ready()
    requests: list[Request] = []
    dropped = generation.dropped or [Dropped()] * len(generation.prompts)
    try:
        for prompt, params, cut in zip(generation.prompts, generation.params, dropped):
            requests.append(engine.submit(prompt, params, keep_tokens=generation.keep_tokens,
                                          dropped=cut, images=generation.images))
    except BaseException as err:
        for request in requests:
            request.cancel()
        error = from_engine(err, max_queue=ctx.config.max_queue) \
            if isinstance(err, Exception) else None
        if error is None:
            raise
        raise error from None
    return requests


def _stream_error(err: Exception) -> APIError:
    if isinstance(err, APIError):
        return err
    log.error("a request failed in the engine: %s", err)
    return APIError(500, f"generation failed: {err}", code="generation_failed")


class Shape(Protocol):
    """How one API shapes a request's answer: the whole response, or its event stream."""

    id: str

    def add(self, index: int, delta: Delta) -> None: ...  # a Delta of a non-streamed answer

    def response(self) -> Any: ...  # the JSON body, once every choice has finished

    def stream_start(self) -> list[bytes]: ...  # events before the first Delta's

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]: ...

    def stream_end(self) -> list[bytes]: ...  # after the last Delta

    def stream_error(self, error: APIError) -> list[bytes]: ...  # ends a failed stream


def sse(value: Any, event: str | None = None) -> bytes:
    """One server-sent event: `data: JSON`, after `event: NAME` when named."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + dumps(value) + b"\n\n"


@dataclass
class Generation:
    """One request of any API, translated: a checked prompt and sampling parameters per
    choice. keep_tokens: control tokens whose text stays in the output
    (ChatPrompt.keep_tokens). dropped: per choice, what fitting its prompt into the context
    left out (ember.context_fit; the usage reports it); choices of one prompt share its
    list of tokens. images: the RGB pixels of the prompts' image markers (ember.media), which
    every choice shares."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    stream: bool
    keep_tokens: Sequence[int] = ()
    dropped: Sequence[Dropped] = ()
    images: Sequence[Any] = ()

    def headers(self) -> dict[str, str]:
        """X-Context-Dropped-Tokens and -Messages: what fitting left out of the request's
        prompts (each counted once, however many choices it has); none when nothing was."""
        seen: dict[int, Dropped] = {id(p): d for p, d in zip(self.prompts, self.dropped)}
        total = sum(seen.values(), Dropped())
        if not total:
            return {}
        return {"x-context-dropped-tokens": str(total.tokens),
                "x-context-dropped-messages": str(total.messages)}


async def respond(request: HTTPRequest, ctx: AppContext, shape: Shape, generation: Generation,
                  arrival: float) -> Response:
    """Submits one engine request per choice and answers in `shape`: JSON once all have
    finished, or an event stream that starts with the first Delta."""
    requests = _submit(ctx, generation)
    events = ChoiceEvents(ctx, requests, shape.id, arrival)
    if not generation.stream:
        try:
            async def collect() -> None:
                while (item := await events.next()) is not None:
                    shape.add(*item)
            await _unless_disconnected(request, collect())
        except _ClientGone:
            log.info("%s: client disconnected, cancelled", shape.id)
            return Response(status_code=499)  # nobody reads it
        except StreamError as err:
            raise _stream_error(err) from None
        finally:
            events.close()
        return json_response(shape.response(), headers=generation.headers() or None)

    try:
        first = await _unless_disconnected(request, events.next())
    except _ClientGone:
        events.close()
        log.info("%s: client disconnected while queued, cancelled", shape.id)
        return Response(status_code=499)
    except StreamError as err:
        events.close()
        raise _stream_error(err) from None

    async def body() -> AsyncIterator[bytes]:
        try:
            for chunk in shape.stream_start():
                yield chunk
            item = first
            while item is not None:
                for chunk in shape.stream_delta(*item):
                    yield chunk
                item = await events.next()
            for chunk in shape.stream_end():
                yield chunk
        except StreamError as err:
            for chunk in shape.stream_error(_stream_error(err)):
                yield chunk
        except Exception:
            log.exception("%s: failed while streaming", shape.id)
            for chunk in shape.stream_error(internal_error()):
                yield chunk

    return EventStreamResponse(body(), events, generation.headers())

