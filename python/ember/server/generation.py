"""The two generation endpoints: validate, enqueue on the backend, answer as JSON or SSE.

Handlers do no generation work: they parse the body (protocol.py), turn the prompt into
tokens, check it fits the context, submit one GenerationRequest per choice and relay the
events (responses.py formats them). Until the first event arrives nothing is sent, so every
failure up to then is a plain HTTP error; after it, a failure becomes a `data: {"error": ...}`
event followed by `data: [DONE]`. A client that goes away (before or during the stream, or while
waiting for a non-streamed answer) cancels all its sequences.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ember.server.backend import (
    BackendError,
    GenerationEvent,
    GenerationRequest,
    GenerationStream,
    Unavailable,
)
from ember.server.errors import APIError, bad_request, dumps, internal_error, json_response
from ember.server.metrics import RequestTimer
from ember.server.protocol import Options, parse_chat_request, parse_completion_request
from ember.server.responses import Formatter

if TYPE_CHECKING:
    from ember.server.app import AppContext

log = logging.getLogger("ember.server")

T = TypeVar("T")
_DONE = b"data: [DONE]\n\n"


def backend_error(err: BackendError) -> APIError:
    if isinstance(err, Unavailable):
        return APIError(503, str(err), code=err.code)
    return APIError(500, str(err), code="generation_failed")


def _sse(value: Any) -> bytes:
    return b"data: " + dumps(value) + b"\n\n"


class ChoiceEvents:
    """The events of a request's sequences as (choice index, event), in arrival order; None
    once every sequence has finished. Feeds each sequence's RequestTimer."""

    def __init__(self, streams: Sequence[GenerationStream], timers: Sequence[RequestTimer]) -> None:
        self._streams = list(streams)
        self._timers = list(timers)
        self._queue: asyncio.Queue[tuple[int, GenerationEvent] | BaseException | None] = \
            asyncio.Queue()
        self._n_open = len(streams)
        # One sequence (the common case) is read directly; several are pumped into one queue.
        self._tasks = [] if len(streams) == 1 else [
            asyncio.create_task(self._pump(i)) for i in range(len(streams))]

    async def _read(self, index: int) -> GenerationEvent | None:
        try:
            event = await self._streams[index].__anext__()
        except StopAsyncIteration:
            return None
        except BackendError:
            self._timers[index].end("error")
            raise
        self._timers[index].on_event(event)
        return event

    async def _pump(self, index: int) -> None:
        try:
            while (event := await self._read(index)) is not None:
                self._queue.put_nowait((index, event))
        except BackendError as err:
            self._queue.put_nowait(err)
        finally:
            self._queue.put_nowait(None)

    async def next(self) -> tuple[int, GenerationEvent] | None:
        if not self._tasks:
            if self._n_open == 0:
                return None
            event = await self._read(0)
            if event is None or event.finish_reason is not None:
                self._n_open = 0
            return (0, event) if event is not None else None
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
        """Cancels what has not finished (the client is gone, or one sequence failed)."""
        for task in self._tasks:
            task.cancel()
        for stream, timer in zip(self._streams, self._timers):
            if not stream.done:
                stream.cancel()
                timer.end("cancelled")


class _ClientGone(Exception):
    pass


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
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

    def __init__(self, content: AsyncIterator[bytes], events: ChoiceEvents) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._events.close()


async def _respond(request: Request, ctx: AppContext, fmt: Formatter,
                   requests: list[GenerationRequest], options: Options,
                   arrival: float) -> Response:
    try:
        streams = ctx.backend.submit(requests)
    except BackendError as err:
        raise backend_error(err) from None
    events = ChoiceEvents(streams, [ctx.metrics.timer(arrival) for _ in streams])
    if not options.stream:
        try:
            async def collect() -> None:
                while (item := await events.next()) is not None:
                    fmt.add(*item)
            await _unless_disconnected(request, collect())
        except _ClientGone:
            log.info("%s: client disconnected, cancelled", fmt.id)
            return Response(status_code=499)  # nobody reads it
        except BackendError as err:
            raise backend_error(err) from None
        finally:
            events.close()
        return json_response(fmt.response())

    try:
        first = await _unless_disconnected(request, events.next())
    except _ClientGone:
        events.close()
        log.info("%s: client disconnected while queued, cancelled", fmt.id)
        return Response(status_code=499)
    except BackendError as err:
        events.close()
        raise backend_error(err) from None

    async def body() -> AsyncIterator[bytes]:
        try:
            for chunk in fmt.first_chunks():
                yield _sse(chunk)
            item = first
            while item is not None:
                for chunk in fmt.chunks(*item):
                    yield _sse(chunk)
                item = await events.next()
            if options.include_usage:
                yield _sse(fmt.usage_chunk())
        except BackendError as err:
            yield _sse(backend_error(err).body())
        except Exception:
            log.exception("%s: failed while streaming", fmt.id)
            yield _sse(internal_error().body())
        yield _DONE

    return EventStreamResponse(body(), events)


def _check_prompt(ctx: AppContext, tokens: list[int], param: str) -> None:
    n_ctx = ctx.backend.n_ctx
    if not tokens:
        raise bad_request("the prompt is empty (it has no tokens to start from)", param=param,
                          code="empty_prompt")
    if len(tokens) > n_ctx:
        raise bad_request(
            f"the prompt has {len(tokens)} tokens, more than the model's context of {n_ctx} "
            "tokens (which prompt and completion share); shorten the prompt", param=param,
            code="context_length_exceeded")


async def chat_completions(request: Request, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    backend = ctx.require_ready()
    parsed = parse_chat_request(body, n_vocab=backend.n_vocab, max_n=ctx.config.max_n)
    options = parsed.options
    model = ctx.check_model(options.model)
    try:
        prompt = await backend.encode_chat(parsed.messages)
    except ValueError as err:
        raise bad_request(str(err), param="messages", code="invalid_messages") from None
    _check_prompt(ctx, prompt, "messages")
    fmt = Formatter(chat=True, model=model, n_choices=options.n, logprobs=options.logprobs)
    requests = [GenerationRequest(f"{fmt.id}-{i}", prompt, options.choice_params(i))
                for i in range(options.n)]
    return await _respond(request, ctx, fmt, requests, options, arrival)


async def completions(request: Request, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    backend = ctx.require_ready()
    parsed = parse_completion_request(body, n_vocab=backend.n_vocab, max_n=ctx.config.max_n)
    options = parsed.options
    model = ctx.check_model(options.model)
    prompts = []
    for prompt in parsed.prompts:
        # Like ember.LLM: control tokens spelled out in a raw prompt are those tokens.
        tokens = (await backend.tokenize(prompt, add_special=True, parse_special=True)
                  if isinstance(prompt, str) else prompt)
        _check_prompt(ctx, tokens, "prompt")
        prompts.append(tokens)
    n = options.n
    fmt = Formatter(chat=False, model=model, n_choices=n * len(prompts),
                    logprobs=options.logprobs,
                    usage_groups=[list(range(p * n, (p + 1) * n)) for p in range(len(prompts))])
    requests = [GenerationRequest(f"{fmt.id}-{p * n + i}", tokens, options.choice_params(i))
                for p, tokens in enumerate(prompts) for i in range(n)]
    return await _respond(request, ctx, fmt, requests, options, arrival)
