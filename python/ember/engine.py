"""Many requests at once on the continuous-batching engine (ember._core.Engine).

The C++ engine thread runs every submitted request in shared batched steps over a paged KV
cache with prefix caching; this module adds the text side: tokenizing prompts, detokenizing
output, end-of-generation tokens and stop strings (a matched stop string cancels the request,
which frees its KV blocks). Results use the types of ember.generate (Delta, GenerationResult),
so callers of the single-sequence loop can switch without changes.

    engine = Engine("model.gguf", parallel=16)
    results = generate_batch(engine, ["Once upon a time", "The sky"], SamplingParams(temperature=0))

    engine = AsyncEngine("model.gguf")
    async for delta in engine.generate("Once upon a time", SamplingParams(max_tokens=32)):
        print(delta.text, end="")
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Union

from ember import _core
from ember.generate import Delta, GenerationResult, Timings, TokenLogprob, Usage
from ember.sampling import SamplingParams

Prompt = Union[str, Sequence[int]]  # text (tokenized with the model's vocabulary) or token ids


class EngineError(RuntimeError):
    """The engine failed a request (its model step raised); the message says why."""


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_usage: float               # fraction of KV blocks some request references
    prefix_query_tokens: int      # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int        # of those, served by it (ember_prefix_cache_hits_total)
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions: int
    steps: int


class _Decoder:
    """Turns one request's TokenEvents into Deltas: detokenizes, drops the end-of-generation
    token, holds back text that may start a stop string, and builds the final result."""

    def __init__(self, engine: Engine, handle: _core.EngineRequest, prompt: list[int],
                 params: SamplingParams, start: float) -> None:
        self.engine = engine
        self.handle = handle
        self.prompt = prompt
        self.params = params
        self.decoder = _core.StreamDecoder(engine.tokenizer)
        self.stops = _core.StopStringMatcher(list(params.stop))
        self.start = start
        self.first_token_at: float | None = None
        self.texts: list[str] = []
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.pending_tokens: list[int] = []
        self.pending_logprobs: list[TokenLogprob] = []
        self.unsent = ""  # text of pending_tokens, not yet in a Delta
        self.n_cached = 0
        self.done = False

    def feed(self, events: Sequence[_core.TokenEvent]) -> Iterator[Delta]:
        for event in events:
            if self.done:
                return
            yield from self._one(event)

    def _one(self, event: _core.TokenEvent) -> Iterator[Delta]:
        if self.first_token_at is None:
            self.first_token_at = perf_counter()
        self.n_cached = event.n_cached_tokens
        reason = event.finish_reason
        if reason == "error":
            self.done = True
            raise EngineError(event.error or "the engine failed the request")
        token = event.token
        if token is not None and reason != "stop":  # a stop token is not part of the output
            self.tokens.append(token)
            self.pending_tokens.append(token)
            if self.params.logprobs and event.logprobs is not None:
                entry = self._logprob(token, event.logprobs)
                self.logprobs.append(entry)
                self.pending_logprobs.append(entry)
            text, stopped, matched = self.stops.push(self.decoder.push(token))
            self.texts.append(text)
            self.unsent += text
            if stopped:
                self.engine.core.cancel(self.handle.id)  # frees its blocks now
                yield self._finish("stop", matched)
                return
        if reason is not None:
            tail = self.stops.push(self.decoder.flush())[0] + self.stops.flush()
            self.texts.append(tail)
            self.unsent += tail
            yield self._finish(reason, None)
        elif self.unsent:
            delta = Delta(self.unsent, self.pending_tokens, self.pending_logprobs)
            self.unsent, self.pending_tokens, self.pending_logprobs = "", [], []
            yield delta

    def _logprob(self, token: int, lp: tuple[float, list[tuple[int, float]]]) -> TokenLogprob:
        def entry(token_id: int, logprob: float) -> TokenLogprob:
            raw = self.engine.tokenizer.token_to_piece(token_id)
            return TokenLogprob(token_id, raw.decode("utf-8", errors="replace"), raw, logprob)

        chosen = entry(token, lp[0])
        chosen.top = [entry(t, v) for t, v in lp[1][: self.params.top_logprobs]]
        return chosen

    def _finish(self, finish_reason: str, stop_string: str | None) -> Delta:
        """The final Delta, with the text not streamed yet and the whole result."""
        self.done = True
        now = perf_counter()
        first = self.first_token_at or now
        prompt_s, generation_s = first - self.start, now - first
        n_prompt, n_out = len(self.prompt), len(self.tokens)
        result = GenerationResult(
            text="".join(self.texts),
            tokens=self.tokens,
            finish_reason=finish_reason,
            usage=Usage(n_prompt, n_out, n_prompt + n_out, self.n_cached),
            timings=Timings(
                prompt_ms=prompt_s * 1e3,
                prompt_tokens_per_s=(n_prompt - self.n_cached) / prompt_s if prompt_s > 0 else 0.0,
                generation_ms=generation_s * 1e3,
                tokens_per_s=(n_out - 1) / generation_s if generation_s > 0 and n_out > 1 else 0.0,
            ),
            logprobs=self.logprobs if self.params.logprobs else None,
            stop_string=stop_string,
        )
        delta = Delta(self.unsent, self.pending_tokens, self.pending_logprobs, finish_reason, result)
        self.unsent, self.pending_tokens, self.pending_logprobs = "", [], []
        return delta


class Engine:
    """A model served by the continuous-batching engine, with its tokenizer. Thread-safe:
    submit and stream from any number of threads; the C++ engine thread computes without the
    GIL. See ember._core.Engine for the arguments."""

    def __init__(self, model_path: str | Path, *, n_threads: int | None = None, n_ctx: int | None = None,
                 parallel: int = 16, kv_size: int | None = None, kv_bytes: int | None = None,
                 block_size: int = 16, max_batch_tokens: int = 512, max_queue: int = 0,
                 kv_type: str = "f16", prefix_caching: bool = True, batch_invariant: bool = True) -> None:
        self.path = Path(model_path)
        self.core = _core.Engine(str(self.path), n_threads=n_threads, n_ctx=n_ctx, parallel=parallel,
                                 kv_size=kv_size, kv_bytes=kv_bytes, block_size=block_size,
                                 max_batch_tokens=max_batch_tokens, max_queue=max_queue,
                                 kv_type=kv_type, prefix_caching=prefix_caching,
                                 batch_invariant=batch_invariant)
        self.tokenizer = _core.Tokenizer(str(self.path))
        self.stop_token_ids = [t for t in range(self.tokenizer.n_vocab) if self.tokenizer.is_eog(t)]

    @property
    def n_ctx(self) -> int:
        return self.core.n_ctx

    @property
    def kv_type(self) -> str:
        """The KV cache's element type: "f16" or "q8_0"."""
        return self.core.kv_type

    @property
    def n_vocab(self) -> int:
        return self.core.n_vocab

    def tokenize(self, prompt: Prompt, add_special: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special, False)
        return [int(t) for t in prompt]

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *, add_special: bool = True,
               priority: int = 0) -> tuple[_core.EngineRequest, list[int], float]:
        """Queues one request: (its handle, the prompt tokens, the submit time). Raises
        ValueError for a request that can never run, _core.EngineBusy when the queue is full."""
        params = params or SamplingParams()
        tokens = self.tokenize(prompt, add_special)
        if not tokens:
            raise ValueError("the prompt is empty (no tokens to start from)")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"the prompt has {len(tokens)} tokens, more than the context holds "
                             f"({self.n_ctx}); use a shorter prompt or a larger n_ctx")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.n_ctx
        start = perf_counter()
        handle = self.core.submit(
            tokens, max_tokens=max(1, max_tokens), stop_token_ids=self.stop_token_ids,
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
            typical_p=params.typical_p, repeat_penalty=params.repeat_penalty,
            repeat_last_n=params.repeat_last_n, presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty, logit_bias=dict(params.logit_bias),
            seed=params.seed, logprobs=params.top_logprobs if params.logprobs else -1, priority=priority)
        return handle, tokens, start

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               add_special: bool = True) -> Iterator[Delta]:
        """One request's Deltas, waiting for events with the GIL released. Closing the iterator
        early cancels the request."""
        params = params or SamplingParams()
        if params.max_tokens == 0:
            return iter([_empty_delta(self.tokenize(prompt, add_special))])
        handle, tokens, start = self.submit(prompt, params, add_special=add_special)
        return self._stream(_Decoder(self, handle, tokens, params, start))

    def _stream(self, decoder: _Decoder) -> Iterator[Delta]:
        try:
            while not decoder.done:
                yield from decoder.feed(decoder.handle.next_events(None))
        finally:
            if not decoder.done:
                self.core.cancel(decoder.handle.id)

    def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                 add_special: bool = True) -> GenerationResult:
        result = None
        for delta in self.stream(prompt, params, add_special=add_special):
            result = delta.result
        assert result is not None
        return result

    def cancel(self, request_id: int) -> None:
        self.core.cancel(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(**self.core.stats())

    def close(self) -> None:
        """Stops the engine thread; unfinished requests end 'cancelled'."""
        self.core.shutdown()

    def __enter__(self) -> Engine:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty_delta(prompt: list[int]) -> Delta:
    n = len(prompt)
    result = GenerationResult("", [], "length", Usage(n, 0, n, 0), Timings(0.0, 0.0, 0.0, 0.0))
    return Delta("", [], [], "length", result)


def generate_batch(engine: Engine, prompts: Sequence[Prompt],
                   params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                   add_special: bool = True) -> list[GenerationResult]:
    """Runs every prompt on the engine at once (all are submitted before any result is read)
    and returns their results in order. `params` is one SamplingParams for all, or one per
    prompt. If one request fails, the others are cancelled and the error is raised."""
    if params is None or isinstance(params, SamplingParams):
        per_prompt = [params or SamplingParams()] * len(prompts)
    else:
        per_prompt = list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
    decoders: list[_Decoder | GenerationResult] = []
    try:
        for prompt, p in zip(prompts, per_prompt):
            if p.max_tokens == 0:
                decoders.append(_empty_delta(engine.tokenize(prompt, add_special)).result)  # type: ignore[arg-type]
                continue
            handle, tokens, start = engine.submit(prompt, p, add_special=add_special)
            decoders.append(_Decoder(engine, handle, tokens, p, start))
        results: list[GenerationResult] = []
        for d in decoders:
            if isinstance(d, GenerationResult):
                results.append(d)
                continue
            result = None
            while not d.done:
                for delta in d.feed(d.handle.next_events(None)):
                    result = delta.result or result
            assert result is not None
            results.append(result)
        return results
    finally:
        for d in decoders:
            if isinstance(d, _Decoder) and not d.done:
                engine.core.cancel(d.handle.id)


class AsyncEngine(Engine):
    """Engine for asyncio: each request's event fd is watched with loop.add_reader, so awaiting
    tokens never blocks the event loop or holds a thread."""

    async def generate_async(self, prompt: Prompt, params: SamplingParams | None = None, *,
                             add_special: bool = True) -> GenerationResult:
        result = None
        async for delta in self.generate_stream(prompt, params, add_special=add_special):
            result = delta.result
        assert result is not None
        return result

    def generate_stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
                        add_special: bool = True) -> AsyncIterator[Delta]:
        """Submits now (errors raise here) and returns the request's Deltas as an async
        iterator; leaving it early (break, task cancelled) cancels the request."""
        params = params or SamplingParams()
        if params.max_tokens == 0:
            return _single(_empty_delta(self.tokenize(prompt, add_special)))
        handle, tokens, start = self.submit(prompt, params, add_special=add_special)
        return self._astream(_Decoder(self, handle, tokens, params, start))

    # `async for delta in engine.generate(...)`: the async engine's generate streams.
    generate = generate_stream  # type: ignore[assignment]

    async def _astream(self, decoder: _Decoder) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        handle = decoder.handle
        ready = asyncio.Event()
        fd = handle.fileno()
        loop.add_reader(fd, ready.set)
        try:
            while not decoder.done:
                events = handle.drain()  # clears the fd first, so no wake-up is lost
                if not events:
                    ready.clear()
                    await ready.wait()
                    continue
                for delta in decoder.feed(events):
                    yield delta
        finally:
            loop.remove_reader(fd)
            if not decoder.done:
                self.core.cancel(handle.id)


async def _single(delta: Delta) -> AsyncIterator[Delta]:
    yield delta
