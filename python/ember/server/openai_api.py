"""OpenAI's two generation endpoints, POST /v1/chat/completions and /v1/completions: the body
parsed (protocol.py) and its prompt made (prompts.py) into one Generation, answered by
respond.py in OpenAI's shapes (ember.openai_format's Formatter; completions' best_of > n by
BestOfShape)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.context_fit import Dropped
from ember.openai_format import Formatter
from ember.results import Delta, GenerationResult
from ember.server.context import AppContext
from ember.server.errors import APIError, json_response
from ember.server.llama_api import prompt_progress, timings_json
from ember.server.prompts import chat_request, infill_tokens, prompt_tokens, request_fit
from ember.server.protocol import Options, parse_completion_request
from ember.server.reasoning import Thinking
from ember.server.respond import Generation, Shape, respond, sse

_DONE = b"data: [DONE]\n\n"


class OpenAIShape:
    """Chat completions and completions (ember.openai_format's Formatter), streams ending with
    `data: [DONE]`. As llama-server answers them, the response and the last chunk carry
    `timings`; llama-server's timings_per_token puts them in every chunk, return_progress sends
    a `prompt_progress` with each choice's opening chunk. A reasoning model's thinking
    (`thinking`) is read out of each choice's text into message.reasoning_content, streamed as
    deltas of their own."""

    def __init__(self, fmt: Formatter, options: Options,
                 thinking: Thinking | None = None, lead: str = "") -> None:
        self.fmt, self.id, self._options = fmt, fmt.id, options
        self._results: dict[int, GenerationResult] = {}
        self._started: set[int] = set()  # choices whose first Delta was streamed
        self._thinking = thinking
        self._lead = lead
        self._splitters = [thinking.splitter(bool(lead)) for _ in fmt.choices] \
            if thinking else []
        # The answer's opening, which every choice repeats (a continued assistant message)
        self._texts: list[list[str]] = [[lead] for _ in self._splitters]
        self._leads = [lead for _ in self._splitters]

    def _timings(self) -> dict[str, Any] | None:
        result = self._results.get(min(self._results)) if self._results else None
        return timings_json(result.usage, result.timings) if result is not None else None

    def add(self, index: int, delta: Delta) -> None:
        if delta.result is not None:
            self._results[index] = delta.result
        if self._thinking is None:
            self.fmt.add(index, delta)
            return
        self._texts[index].append(delta.text)
        if delta.result is not None:
            self.fmt.add(index, replace(delta, text=self._thinking.split(
                "".join(self._texts[index]), bool(self._lead))[1]))
        else:
            self.fmt.add(index, replace(delta, text=""))

    def response(self) -> Any:
        out = self.fmt.response()
        if self._thinking is not None:
            for choice in out["choices"]:
                thought = self._thinking.split("".join(self._texts[choice["index"]]),
                                               bool(self._lead))[0]
                choice["message"]["reasoning_content"] = thought or None
        timings = self._timings()
        return {**out, "timings": timings} if timings is not None else out

    def _split(self, index: int, delta: Delta) -> tuple[list[bytes], Delta]:
        """The reasoning_content chunk of a streamed delta, and the delta of its content."""
        assert self._thinking is not None
        text, self._leads[index] = self._leads[index] + delta.text, ""
        thought, content = self._splitters[index].push(text, delta.result is not None)
        if self._thinking.keep_in_content:
            content = text
        chunks = [sse(self.fmt.reasoning_chunk(index, thought))] if thought else []
        return chunks, replace(delta, text=content)

    def stream_start(self) -> list[bytes]:
        if self._options.return_progress:  # each choice's opening comes with its progress
            return []
        return [sse(chunk) for chunk in self.fmt.first_chunks()]

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        o = self._options
        out: list[bytes] = []
        chunks = []
        if o.return_progress and index not in self._started:
            opening = self.fmt.opening_chunk(index)
            if delta.usage is not None and delta.timings is not None:
                opening["prompt_progress"] = prompt_progress(delta.usage, delta.timings)
            chunks.append(opening)
        self._started.add(index)
        if self._thinking is not None:
            out, delta = self._split(index, delta)
        chunks += self.fmt.chunks(index, delta)
        if delta.result is not None:
            self._results[index] = delta.result
        if delta.usage is not None and delta.timings is not None:
            timings = timings_json(delta.usage, delta.timings)
            if o.timings_per_token:
                for chunk in chunks:
                    chunk["timings"] = timings
            elif chunks and delta.result is not None and not o.include_usage:
                chunks[-1]["timings"] = timings  # else the usage chunk, the last, has them
        return out + [sse(chunk) for chunk in chunks]

    def stream_end(self) -> list[bytes]:
        if not self._options.include_usage:
            return [_DONE]
        chunk = self.fmt.usage_chunk()
        timings = self._timings()
        if timings is not None:
            chunk["timings"] = timings
        return [sse(chunk), _DONE]

    def stream_error(self, error: APIError) -> list[bytes]:
        return [sse(error.body()), _DONE]


async def chat_completions(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    parsed, prompt = await chat_request(request, ctx, body)
    options = parsed.options
    fmt = Formatter(chat=True, model=ctx.model_name, n_choices=options.n,
                    logprobs=options.logprobs, tool_format=prompt.tool_format,
                    answer_prefix=prompt.answer_prefix, post_sampling=options.post_sampling_probs)
    lead = parsed.prefill or "" if parsed.prefill_in_reply else ""
    if lead and prompt.thinking is None:
        for i in range(options.n):
            fmt.echo(i, lead, [])
    generation = Generation([prompt.tokens] * options.n,
                            [options.choice_params(i) for i in range(options.n)],
                            options.stream, prompt.keep_tokens, [prompt.dropped] * options.n,
                            prompt.images)
    return await respond(request, ctx,
                         OpenAIShape(fmt, options, prompt.thinking,
                                     lead if prompt.thinking is not None else ""),
                         generation, arrival)


async def completions(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    engine = ctx.require_ready()
    parsed = await ctx.offload(request, parse_completion_request, body, engine.n_vocab,
                               engine.n_ctx, ctx.defaults)
    options = parsed.options
    prompts, dropped = [], []
    for pieces in parsed.prompts:
        if parsed.suffix is not None:
            prefix = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], str) else pieces
            prompts.append(infill_tokens(ctx, prefix, parsed.suffix, "suffix",
                                         length_param="prompt"))
            dropped.append(Dropped())
        else:
            tokens, cut = await prompt_tokens(ctx, pieces, fit=request_fit(ctx, options))
            prompts.append(tokens)
            dropped.append(cut)
    n = options.n
    fmt = Formatter(chat=False, model=ctx.model_name, n_choices=n * len(prompts),
                    logprobs=options.logprobs,
                    usage_groups=[list(range(p * n, (p + 1) * n)) for p in range(len(prompts))])
    if parsed.echo:
        for p, (pieces, tokens) in enumerate(zip(parsed.prompts, prompts)):
            text = pieces[0] if isinstance(pieces[0], str) else engine.tokenizer.decode(tokens)
            scored = (await ctx.scorer.score(tokens, options.top_logprobs)
                      if options.logprobs else [])
            for i in range(p * n, (p + 1) * n):
                fmt.echo(i, text, scored)
    shape: Shape = OpenAIShape(fmt, options)
    k = parsed.best_of  # candidates per prompt
    params = [options.choice_params(i) for _ in prompts for i in range(k)]
    if k > n:  # ranked by their tokens' mean logprob, which needs the logprobs
        params = [replace(p, logprobs=True) for p in params]
        shape = BestOfShape(fmt, n, k)
    generation = Generation([tokens for tokens in prompts for _ in range(k)], params,
                            options.stream, dropped=[d for d in dropped for _ in range(k)])
    return await respond(request, ctx, shape, generation, arrival)


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


async def chat_input_tokens(request: HTTPRequest, ctx: AppContext) -> Response:
    """llama-server's POST /v1/chat/completions/input_tokens: a chat body's prompt tokens, as
    the chat template (and tools) render them."""
    body = await ctx.read_json(request)
    _, prompt = await chat_request(request, ctx, body)
    return json_response({"object": "response.input_tokens", "input_tokens": len(prompt.tokens)})
