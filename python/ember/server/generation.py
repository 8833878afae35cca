"""OpenAI's two generation endpoints, and the request path every API's endpoints share
(`respond`: validate, enqueue on the engine, answer as JSON or SSE in a `Shape`).

Handlers do no generation work: they parse the body (protocol.py), turn the prompt into
tokens, check it fits the context, submit one engine Request per choice and relay its Deltas
(shaped by ember.openai_format here; llama_api.py, responses_api.py and anthropic_api.py shape
their own). Until the first event arrives nothing is sent, so every failure up to then is a
plain HTTP error; after it, a failure becomes an error event (OpenAI: `data: {"error": ...}`
then `data: [DONE]`). A client that goes away (before or during the stream, or while
waiting for a non-streamed answer) cancels all its sequences.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ember.chat.limits import RenderLimits
from ember.chat.template import ChatTemplateError, ChatTemplateLimitError
from ember.engine import EngineBusy, EngineError, Request
from ember.grammar import Constraint, ConstraintError
from ember.openai_format import Formatter
from ember.results import Delta
from ember.sampling import SamplingParams
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, dumps, internal_error, json_response
from ember.server.fim import infill_prompt
from ember.server.fim import require as require_fim
from ember.server.prompt_bound import PromptBound
from ember.server.protocol import (
    ChatCompletionRequest,
    Prompt,
    check_text,
    parse_chat_request,
    parse_completion_request,
)
from ember.tools import prompt as tool_prompt
from ember.tools.calls import ToolFormat
from ember.tools.request import ToolRequest

log = logging.getLogger("ember.server")

T = TypeVar("T")
_DONE = b"data: [DONE]\n\n"

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

    def __init__(self, content: AsyncIterator[bytes], events: ChoiceEvents) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._events.close()


def _submit(ctx: AppContext, prompts: Sequence[list[int]], params: Sequence[SamplingParams],
            keep_tokens: Sequence[int] = ()) -> list[Request]:
    """Queues every choice or none: a full queue is a 503 and cancels what was queued."""
    engine = ctx.require_ready()
    requests: list[Request] = []
    try:
        for prompt, p in zip(prompts, params):
            requests.append(engine.submit(prompt, p, keep_tokens=keep_tokens))
    except BaseException as err:
        for request in requests:
            request.cancel()
        if isinstance(err, EngineBusy):
            raise APIError(503, f"the server is busy: the queue holds {ctx.config.max_queue} "
                           "waiting requests (--max-queue); retry later",
                           code="queue_full") from None
        if isinstance(err, ConstraintError):
            raise bad_request(str(err), param=err.param, code="invalid_value") from None
        if isinstance(err, ValueError):
            raise bad_request(str(err), code="invalid_value") from None
        raise
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


class OpenAIShape:
    """Chat completions and completions (ember.openai_format's Formatter), streams ending with
    `data: [DONE]`."""

    def __init__(self, fmt: Formatter, include_usage: bool) -> None:
        self.fmt, self.id, self._include_usage = fmt, fmt.id, include_usage

    def add(self, index: int, delta: Delta) -> None:
        self.fmt.add(index, delta)

    def response(self) -> Any:
        return self.fmt.response()

    def stream_start(self) -> list[bytes]:
        return [sse(chunk) for chunk in self.fmt.first_chunks()]

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        return [sse(chunk) for chunk in self.fmt.chunks(index, delta)]

    def stream_end(self) -> list[bytes]:
        return [*([sse(self.fmt.usage_chunk())] if self._include_usage else []), _DONE]

    def stream_error(self, error: APIError) -> list[bytes]:
        return [sse(error.body()), _DONE]


async def respond(request: HTTPRequest, ctx: AppContext, shape: Shape,
                  prompts: list[list[int]], params: list[SamplingParams], stream: bool,
                  arrival: float, keep_tokens: Sequence[int] = ()) -> Response:
    """Submits one engine request per prompt (every choice) and answers in `shape`: JSON once
    all have finished, or an event stream that starts with the first Delta. keep_tokens:
    control tokens whose text stays in the output (ChatPrompt.keep_tokens)."""
    requests = _submit(ctx, prompts, params, keep_tokens)
    events = ChoiceEvents(ctx, requests, shape.id, arrival)
    if not stream:
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
        return json_response(shape.response())

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

    return EventStreamResponse(body(), events)


def check_prompt(ctx: AppContext, tokens: list[int], param: str) -> None:
    n_ctx = ctx.require_ready().n_ctx
    if not tokens:
        raise bad_request("the prompt is empty (it has no tokens to start from)", param=param,
                          code="empty_prompt")
    if len(tokens) > n_ctx:
        raise bad_request(
            f"the prompt has {len(tokens)} tokens, more than the model's context of {n_ctx} "
            "tokens (which prompt and completion share); shorten the prompt", param=param,
            code="context_length_exceeded")


def _bound(ctx: AppContext) -> PromptBound:
    ctx.require_ready()
    assert ctx.bound is not None  # set with the engine
    return ctx.bound


async def tokenize_text(ctx: AppContext, text: str, add_special: bool, parse_special: bool,
                        param: str = "prompt", within_context: bool = True) -> list[int]:
    """The tokens of a text: a 400 for text that is not UTF-8 or (within_context: a prompt)
    certainly longer than the context, checked before tokenizing; short texts on the event
    loop, longer ones in a thread."""
    engine = ctx.require_ready()
    check_text(text, param)
    if within_context:
        _bound(ctx).check(text, param)
    if len(text) <= _INLINE_TOKENIZE_CHARS:
        return engine.tokenize(text, add_special, parse_special)
    return await ctx.in_background(engine.tokenize, text, add_special, parse_special)


def render_limits(bound: PromptBound) -> RenderLimits:
    """Request-time limits of the chat template: 1 s, and no more output than could fit the
    context (PromptBound), so a long conversation stops rendering once it is certainly too
    long."""
    return RenderLimits(max_seconds=1.0, max_chars=bound.max_bytes,
                        max_total_chars=max(16 * bound.max_bytes, 4 << 20))


@dataclass
class ChatPrompt:
    tokens: list[int]
    tool_format: ToolFormat | None = None  # parse the answer for tool calls in this format
    keep_tokens: list[int] = field(default_factory=list)  # control tokens kept as text
    answer_prefix: str = ""  # the answer's opening (a forced call's), ending the prompt
    constraint: Constraint | None = None  # a forced call: what the answer must be


def _render_chat(ctx: AppContext, messages: list[dict[str, Any]], within_context: bool,
                 prefill: str | None = None, add_generation_prompt: bool = True,
                 tools: ToolRequest | None = None) -> tuple[str, tool_prompt.PreparedChat]:
    """Runs in a worker thread: tools into the messages (ember.tools.prompt), render
    (bounded), the context bound. With `prefill`, the reply's opening text follows the
    rendered prompt."""
    engine = ctx.require_ready()
    assert ctx.template is not None
    bound = _bound(ctx)
    limits = render_limits(bound) if within_context else RenderLimits()
    try:
        chat = tool_prompt.prepare_chat(ctx.template, engine.tokenizer, messages, tools)
        text = ctx.template.render(chat.messages, add_generation_prompt=add_generation_prompt,
                                   limits=limits, **chat.variables) + (prefill or "") \
            + chat.answer_prefix
    except ChatTemplateLimitError as err:
        if err.kind == "size":
            raise bound.too_long("messages", f"more text than that ({err})") from None
        raise bad_request(f"the chat template took too long on these messages ({err})",
                          param="messages", code="chat_template_timeout") from None
    except ChatTemplateError as err:
        raise bad_request(str(err), param="messages", code="invalid_messages") from None
    check_text(text, "messages")
    if within_context:
        bound.check(text, "messages")
    return text, chat


def _encode_chat(ctx: AppContext, messages: list[dict[str, Any]], within_context: bool,
                 prefill: str | None = None, add_generation_prompt: bool = True,
                 tools: ToolRequest | None = None) -> ChatPrompt:
    """Runs in a worker thread: _render_chat, then tokenize."""
    engine = ctx.require_ready()
    assert ctx.template is not None
    text, chat = _render_chat(ctx, messages, within_context, prefill, add_generation_prompt,
                              tools)
    return ChatPrompt(ctx.template.tokenize(engine.tokenizer, text), chat.format,
                      chat.keep_tokens, chat.answer_prefix,
                      chat.constraint.grammar() if chat.constraint is not None else None)


async def render_chat(ctx: AppContext, messages: list[dict[str, Any]], prefill: str | None,
                      add_generation_prompt: bool) -> str:
    """The prompt text of checked messages (llama-server's /apply-template)."""
    text, _ = await ctx.in_worker(_render_chat, ctx, messages, False, prefill,
                                  add_generation_prompt)
    return text


async def encode_chat_prompt(ctx: AppContext, messages: list[dict[str, Any]],
                             within_context: bool = True, prefill: str | None = None,
                             add_generation_prompt: bool = True,
                             tools: ToolRequest | None = None) -> ChatPrompt:
    """The prompt of checked messages (and tools) in the model's chat template, rendered and
    tokenized in a worker thread, with how to read tool calls in the answer; a 400 when the
    template refuses them, runs past its limits or the prompt is certainly longer than the
    context."""
    return await ctx.in_worker(_encode_chat, ctx, messages, within_context, prefill,
                               add_generation_prompt, tools)


async def encode_chat(ctx: AppContext, messages: list[dict[str, Any]],
                      within_context: bool = True) -> list[int]:
    """The prompt tokens of checked messages (encode_chat_prompt without tools)."""
    return (await encode_chat_prompt(ctx, messages, within_context)).tokens


_INLINE_TOKENIZE_CHARS = 4096


async def prepare_chat(request: HTTPRequest, ctx: AppContext, body: dict[str, Any]
                       ) -> tuple[ChatCompletionRequest, ChatPrompt]:
    """A chat-shaped body (OpenAI's, or another API's translated to it) checked, rendered and
    tokenized: the parsed request and its prompt (tokens, and how to read tool calls). A
    forced tool call's constraint goes into the sampling parameters."""
    engine = ctx.require_ready()
    parsed = await ctx.offload(request, lambda: parse_chat_request(
        body, n_vocab=engine.n_vocab, n_ctx=engine.n_ctx, defaults=ctx.defaults))
    prompt = await encode_chat_prompt(ctx, parsed.messages, prefill=parsed.prefill,
                                      add_generation_prompt=parsed.add_generation_prompt,
                                      tools=parsed.tools)
    check_prompt(ctx, prompt.tokens, "messages")
    if prompt.constraint is not None:
        parsed.options.params = replace(parsed.options.params, constraint=prompt.constraint)
    return parsed, prompt


async def chat_completions(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    parsed, prompt = await prepare_chat(request, ctx, body)
    options = parsed.options
    model = ctx.check_model(options.model)
    fmt = Formatter(chat=True, model=model, n_choices=options.n, logprobs=options.logprobs,
                    tool_format=prompt.tool_format, answer_prefix=prompt.answer_prefix)
    if parsed.prefill_in_reply and parsed.prefill:
        for i in range(options.n):
            fmt.echo(i, parsed.prefill, [])
    params = [options.choice_params(i) for i in range(options.n)]
    return await respond(request, ctx, OpenAIShape(fmt, options.include_usage),
                         [prompt.tokens] * options.n, params, options.stream, arrival,
                         prompt.keep_tokens)


async def completions(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    engine = ctx.require_ready()
    parsed = await ctx.offload(request, lambda: parse_completion_request(
        body, n_vocab=engine.n_vocab, n_ctx=engine.n_ctx, defaults=ctx.defaults))
    options = parsed.options
    model = ctx.check_model(options.model)
    prompts = []
    for prompt in parsed.prompts:
        if parsed.suffix is not None:
            tokens = infill_tokens(ctx, prompt, parsed.suffix, param="suffix")
        else:
            # Like ember.LLM: control tokens spelled out in a raw prompt are those tokens.
            tokens = (await tokenize_text(ctx, prompt, add_special=True, parse_special=True)
                      if isinstance(prompt, str) else prompt)
        check_prompt(ctx, tokens, "prompt")
        prompts.append(tokens)
    n = options.n
    fmt = Formatter(chat=False, model=model, n_choices=n * len(prompts),
                    logprobs=options.logprobs,
                    usage_groups=[list(range(p * n, (p + 1) * n)) for p in range(len(prompts))])
    if parsed.echo:
        for p, (prompt, tokens) in enumerate(zip(parsed.prompts, prompts)):
            text = prompt if isinstance(prompt, str) else engine.tokenizer.decode(tokens)
            scored = (await ctx.scorer.score(tokens, options.top_logprobs)
                      if options.logprobs else [])
            for i in range(p * n, (p + 1) * n):
                fmt.echo(i, text, scored)
    shape: Shape = OpenAIShape(fmt, options.include_usage)
    k = parsed.best_of  # candidates per prompt
    params = [options.choice_params(i) for _ in prompts for i in range(k)]
    if k > n:  # ranked by their tokens' mean logprob, which needs the logprobs
        params = [replace(p, logprobs=True) for p in params]
        shape = BestOfShape(fmt, n, k)
    all_prompts = [tokens for tokens in prompts for _ in range(k)]
    return await respond(request, ctx, shape, all_prompts, params, options.stream, arrival)


class BestOfShape:
    """Completions' best_of > n: `best_of` candidates per prompt, of which the n with the
    highest mean token logprob are answered (as OpenAI ranks them), in candidate order. Usage
    counts every candidate's tokens, as OpenAI bills them. Never streamed (protocol.py)."""

    def __init__(self, fmt: Formatter, n: int, best_of: int) -> None:
        self.fmt, self.id, self._n, self._k = fmt, fmt.id, n, best_of
        self._deltas: dict[int, list[Delta]] = {}

    def add(self, index: int, delta: Delta) -> None:
        self._deltas.setdefault(index, []).append(delta)

    def _score(self, index: int) -> float:
        logprobs = [lp.logprob for d in self._deltas.get(index, []) for lp in d.logprobs]
        return sum(logprobs) / len(logprobs) if logprobs else float("-inf")

    def response(self) -> Any:
        n_prompts = len(self.fmt.choices) // self._n
        for p in range(n_prompts):
            candidates = range(p * self._k, (p + 1) * self._k)
            best = sorted(sorted(candidates, key=self._score, reverse=True)[:self._n])
            for j, index in enumerate(best):
                for delta in self._deltas.get(index, []):
                    self.fmt.add(p * self._n + j, delta)
        out = self.fmt.response()
        finals = [d[-1].result for d in self._deltas.values() if d and d[-1].result]
        completion = sum(r.usage.completion_tokens for r in finals)
        out["usage"]["completion_tokens"] = completion
        out["usage"]["total_tokens"] = out["usage"]["prompt_tokens"] + completion
        return out

    def stream_start(self) -> list[bytes]:
        raise AssertionError("best_of > n is never streamed")

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        raise AssertionError("best_of > n is never streamed")

    def stream_end(self) -> list[bytes]:
        raise AssertionError("best_of > n is never streamed")

    def stream_error(self, error: APIError) -> list[bytes]:
        raise AssertionError("best_of > n is never streamed")


def infill_tokens(ctx: AppContext, prefix: Prompt, suffix: str, param: str, prompt: str = "",
                  extra: Sequence[tuple[str, str]] = ()) -> list[int]:
    """A fill-in-the-middle prompt (fim.py); a 400 naming `param` for a model without FIM
    tokens, or a prefix given as token ids."""
    engine = ctx.require_ready()
    fim = require_fim(ctx.fim, param)
    if not isinstance(prefix, str):
        raise bad_request(f"'{param}' needs the prompt as text, not token ids", param=param,
                          code="invalid_value")
    for text in (prefix, suffix, prompt, *(t for pair in extra for t in pair)):
        check_text(text, param)
        _bound(ctx).check(text, param)

    def tokenize(text: str) -> list[int]:
        return engine.tokenize(text, add_special=False, parse_special=False) if text else []

    bos = engine.tokenize("", add_special=True, parse_special=False)
    return infill_prompt(fim, tokenize, prefix, suffix, prompt, extra, bos)
