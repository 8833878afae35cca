"""The server's one dependency on the engine: a narrow GenerationBackend interface.

The HTTP layer (app.py, handlers) validates requests, turns them into GenerationRequests and
consumes GenerationEvents; it never touches a model. LLMBackend (llm_backend.py) implements
this on ember.LLM; a backend on the C++ continuous-batching engine implements the same
protocol, and nothing else in ember.server changes.

Admission is synchronous (`submit` either accepts every request of a call or raises), so an
over-full queue or a shutting-down server is a plain HTTP error before any byte is streamed.
Events then arrive through a GenerationStream, which a backend may feed from any thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ember.chat import Message
from ember.generate import TokenLogprob, Usage
from ember.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str          # unique per generated sequence (an n=3 request submits three)
    prompt_tokens: list[int]
    params: SamplingParams


@dataclass
class GenerationEvent:
    """New output of one sequence. The last event of a sequence has finish_reason ("stop":
    end-of-generation token or stop string, "length": max_tokens or a full context) and usage."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token when asked for
    finish_reason: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True)
class SlotInfo:
    """One of the `parallel` places a sequence runs in, llama-server's /slots style."""

    id: int
    is_processing: bool
    request_id: str | None
    n_ctx: int
    n_prompt_tokens: int     # of the request being processed (or last processed)
    n_decoded: int           # tokens generated so far for it
    n_cached_tokens: int     # tokens whose KV entries the slot holds for prefix reuse


@dataclass(frozen=True)
class BackendStats:
    n_running: int
    n_waiting: int
    kv_cache_usage: float    # in [0, 1]


@dataclass(frozen=True)
class Health:
    status: str              # "loading", "ok", "error" or "shutting_down"
    message: str = ""


class BackendError(Exception):
    """A request could not be served; the message is for the client."""


class Unavailable(BackendError):
    """Not now: the model is loading, the queue is full, or the server is shutting down
    (answered with 503). `code` names which."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class GenerationFailed(BackendError):
    """The engine failed while generating (a bug or a resource failure; logged server-side)."""


class GenerationBackend(Protocol):
    """What the server needs from an engine. Every method but `load` is called on the event
    loop's thread and must not block it for long."""

    @property
    def model_path(self) -> str: ...
    @property
    def n_ctx(self) -> int: ...           # context of one sequence (prompt + completion)
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_slots(self) -> int: ...

    def load(self, loop: asyncio.AbstractEventLoop) -> None:
        """Loads the model; blocking, run in a thread. Raises on failure. Events are delivered
        on `loop`."""

    def health(self) -> Health: ...

    async def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...
    async def detokenize(self, tokens: Sequence[int]) -> str: ...
    def token_piece(self, token: int) -> bytes: ...

    async def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Prompt tokens of `messages` in the model's chat template; ValueError (with a message
        for the client) when the template rejects them."""

    def submit(self, requests: Sequence[GenerationRequest]) -> list[GenerationStream]:
        """Queues all `requests` or none (Unavailable). Prompts are already checked: non-empty,
        no longer than n_ctx."""

    def slots(self) -> list[SlotInfo]: ...
    def stats(self) -> BackendStats: ...

    def stop_accepting(self) -> None:
        """From now on submit raises Unavailable("shutting_down"); queued work continues."""

    def cancel_all(self, reason: str) -> None:
        """Ends every queued and running request with Unavailable(reason)."""

    def close(self, timeout: float) -> None:
        """Stops the workers (after cancel_all), waiting at most `timeout` seconds."""


# Texts up to this many characters are tokenized on the event loop; longer ones in a thread.
_INLINE_TOKENIZE_CHARS = 4096


class BackendBase:
    """What every backend shares: readiness, the model's sizes, and text <-> tokens through the
    model's tokenizer and chat template. Subclasses set the attributes below while loading and
    provide _require_tokenizer (Unavailable until the model is loaded)."""

    _model_arg: object
    _path: object
    _parallel: int
    _n_ctx: int
    _n_vocab: int
    _health: Health
    _template: object

    def _require_tokenizer(self):  # -> ember._core.Tokenizer
        raise NotImplementedError

    def _set_ready(self) -> None:
        if self._health.status == "loading":
            self._health = Health("ok")

    # --- properties --------------------------------------------------------------------------

    @property
    def model_path(self) -> str:
        return str(self._path) if self._path else str(self._model_arg or "")

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_slots(self) -> int:
        return self._parallel

    def health(self) -> Health:
        return self._health

    async def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        tokenizer = self._require_tokenizer()
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return list(tokenizer.encode(text, add_special, parse_special))
        ids = await asyncio.to_thread(tokenizer.encode, text, add_special, parse_special)
        return list(ids)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        tokenizer = self._require_tokenizer()
        for token in tokens:
            if not 0 <= token < self._n_vocab:
                raise ValueError(f"token id {token} is out of range [0, {self._n_vocab})")
        return tokenizer.decode(list(tokens), skip_special=True)

    def token_piece(self, token: int) -> bytes:
        return self._require_tokenizer().token_to_piece(token)

    async def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        template = self._template
        if template is None:
            raise Unavailable("the model is loading", "model_loading")
        text = template.render(messages, add_generation_prompt=True)
        # As ember.LLM does: templates that write BOS themselves must not get a second one.
        add_special = not (template.bos_token and text.startswith(template.bos_token))
        return await self.tokenize(text, add_special=add_special, parse_special=True)


class GenerationStream:
    """The events of one GenerationRequest, as an async iterator; it ends after the event with
    finish_reason, or raises the BackendError the backend failed it with.

    `put` and `fail` may be called from any thread; iteration and `cancel` belong to the event
    loop. Once the stream is done (finished, failed or cancelled) later puts are dropped, so a
    worker that notices a cancellation one token late is harmless.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop,
                 on_cancel: Callable[[GenerationStream], None]) -> None:
        self.request_id = request_id
        self._loop = loop
        self._on_cancel = on_cancel
        # None marks the end of a cancelled stream.
        self._queue: asyncio.Queue[GenerationEvent | BackendError | None] = asyncio.Queue()
        self._done = False       # nothing more will be delivered
        self._ended = False      # the consumer has seen the end
        self.cancelled = False

    # --- producer side (any thread) ------------------------------------------------------------

    def put(self, event: GenerationEvent) -> None:
        self._send(event)

    def fail(self, error: BackendError) -> None:
        self._send(error)

    def _send(self, item: GenerationEvent | BackendError) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver, item)
        except RuntimeError:
            pass  # the event loop is closed: the server has stopped, nobody is listening

    def _deliver(self, item: GenerationEvent | BackendError) -> None:
        if self._done:
            return
        if isinstance(item, BackendError) or item.finish_reason is not None:
            self._done = True
        self._queue.put_nowait(item)

    # --- consumer side (event loop) ------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done

    def cancel(self) -> None:
        """The client is gone or no longer wants the result: the backend stops the sequence
        (between two tokens) and frees its slot. Idempotent; a no-op once the stream is done."""
        if self._done:
            return
        self._done = True
        self.cancelled = True
        self._queue.put_nowait(None)
        self._on_cancel(self)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, BackendError):
            self._ended = True
            raise item
        if item.finish_reason is not None:
            self._ended = True
        return item
