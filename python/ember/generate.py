"""The generation loop of one sequence: prefill the prompt (reusing the KV cache when the prompt
extends what is cached), then sample, detokenize and check for stops one token at a time.

This is the one place that drives the model token by token; the batching engine replaces it
without changing the result types below, which ember.LLM and the CLI consume.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from ember import _core
from ember.sampling import SamplingParams


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV cache entries were reused, not evaluated

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's usage object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass
class Timings:
    prompt_ms: float            # evaluating the prompt (its uncached part)
    prompt_tokens_per_s: float
    generation_ms: float        # from the end of the prompt to the last token
    tokens_per_s: float         # generated tokens per second of generation_ms


@dataclass
class TokenLogprob:
    """A token's log-probability under the model's raw logits, as OpenAI reports it."""

    token: int
    text: str     # its bytes decoded as UTF-8, broken sequences as U+FFFD
    bytes: bytes
    logprob: float
    top: list[TokenLogprob] = field(default_factory=list)  # the most likely tokens at this step


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]       # generated ids; an end-of-generation token is not among them
    finish_reason: str      # "stop" (end token or stop string) or "length" (max_tokens, context)
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None  # one per generated token when asked for
    stop_string: str | None = None              # the stop string that ended the text


@dataclass
class Delta:
    """A piece of streamed output: new text and the tokens that produced it. Text that could be
    the start of a stop string is held back, so some tokens arrive with the next piece of text.
    The last delta carries finish_reason and the whole result."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: str | None = None
    result: GenerationResult | None = None


class Sequence:
    """The model's single KV-cached sequence and the tokens in it.

    `tokens` is None while an evaluation is in flight: if it never returns normally (an
    exception, a KeyboardInterrupt), the cache content is unknown and the next prefill
    starts over instead of trusting it.
    """

    def __init__(self, model: _core.Model) -> None:
        self.model = model
        self.tokens: list[int] | None = []
        self._tickets = itertools.count(1)
        self._owner = 0

    def claim(self) -> int:
        """A new request takes the sequence over; an older one still streaming is superseded."""
        self._owner = next(self._tickets)
        return self._owner

    def check_owner(self, ticket: int) -> None:
        if ticket != self._owner:
            raise RuntimeError("this generation was superseded by a newer request on the same "
                               "LLM; one LLM runs one generation at a time")

    def prefill(self, prompt: list[int]) -> tuple[np.ndarray, int]:
        """Logits [n_vocab] after the prompt and how many of its tokens were already cached."""
        cached, self.tokens = self.tokens, None
        if cached and len(prompt) > len(cached) and prompt[:len(cached)] == cached:
            logits = self.model.eval_last(prompt[len(cached):], reset=False)
            n_cached = len(cached)
        else:
            logits = self.model.eval_last(prompt, reset=True)
            n_cached = 0
        self.tokens = list(prompt)
        return logits, n_cached

    def append(self, token: int) -> np.ndarray:
        """Logits [n_vocab] after one more token."""
        known, self.tokens = self.tokens, None
        if known is None:
            raise RuntimeError("the KV cache is in an unknown state; start a new generation")
        logits = self.model.eval_last([token], reset=False)
        known.append(token)
        self.tokens = known
        return logits

    def reset(self) -> None:
        self.tokens = []
        self.model.reset()


def token_logprob(tokenizer: _core.Tokenizer, logits: np.ndarray, token: int,
                  n_top: int) -> TokenLogprob:
    def entry(token_id: int, logprob: float) -> TokenLogprob:
        raw = tokenizer.token_to_piece(token_id)
        return TokenLogprob(token_id, raw.decode("utf-8", errors="replace"), raw, logprob)

    logprob, top = _core.token_logprobs(logits, token, n_top)
    chosen = entry(token, logprob)
    chosen.top = [entry(t, lp) for t, lp in top]
    return chosen


def generate(sequence: Sequence, tokenizer: _core.Tokenizer, prompt: list[int],
             params: SamplingParams) -> Iterator[Delta]:
    """One request: checked now (a bad prompt or parameter raises ValueError right here), run
    as the returned iterator is consumed, yielding a Delta whenever text becomes final."""
    model = sequence.model
    if not prompt:
        raise ValueError("the prompt is empty (no tokens to start from)")
    if len(prompt) > model.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens, more than the context holds "
                         f"({model.n_ctx}); use a shorter prompt or a larger n_ctx")
    sampler = params.make_sampler(model.n_vocab)
    return _run(sequence, tokenizer, prompt, params, sampler)


def _run(sequence: Sequence, tokenizer: _core.Tokenizer, prompt: list[int],
         params: SamplingParams, sampler: _core.Sampler) -> Iterator[Delta]:
    model = sequence.model
    ticket = sequence.claim()
    sampler.accept_many(prompt)  # penalties count the prompt too, as llama.cpp does
    decoder = _core.StreamDecoder(tokenizer)
    stops = _core.StopStringMatcher(list(params.stop))
    max_tokens = params.max_tokens if params.max_tokens is not None else model.n_ctx

    start = perf_counter()
    logits, n_cached = sequence.prefill(prompt)
    prompt_done = perf_counter()

    texts: list[str] = []
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    pending_tokens: list[int] = []
    pending_logprobs: list[TokenLogprob] = []
    finish_reason = "length"
    stop_string: str | None = None
    while len(tokens) < max_tokens:
        token = sampler.sample(logits)
        if tokenizer.is_eog(token):
            finish_reason = "stop"
            break
        sampler.accept(token)
        tokens.append(token)
        pending_tokens.append(token)
        if params.logprobs:
            entry = token_logprob(tokenizer, logits, token, params.top_logprobs)
            logprobs.append(entry)
            pending_logprobs.append(entry)
        text, stopped, matched = stops.push(decoder.push(token))
        if stopped:
            texts.append(text)
            finish_reason, stop_string = "stop", matched
            break
        if text:
            texts.append(text)
            yield Delta(text, pending_tokens, pending_logprobs)
            pending_tokens, pending_logprobs = [], []
        if len(tokens) == max_tokens or len(prompt) + len(tokens) >= model.n_ctx:
            break  # the token is output; evaluating it would be wasted (or overflow)
        sequence.check_owner(ticket)
        logits = sequence.append(token)

    if stop_string is None:
        tail = stops.push(decoder.flush())[0] + stops.flush()
        texts.append(tail)
    else:
        tail = texts[-1]
    done = perf_counter()
    generation_s = done - prompt_done
    prompt_s = prompt_done - start
    n_evaluated = len(prompt) - n_cached
    result = GenerationResult(
        text="".join(texts),
        tokens=tokens,
        finish_reason=finish_reason,
        usage=Usage(len(prompt), len(tokens), len(prompt) + len(tokens), n_cached),
        timings=Timings(
            prompt_ms=prompt_s * 1e3,
            prompt_tokens_per_s=n_evaluated / prompt_s if prompt_s > 0 else 0.0,
            generation_ms=generation_s * 1e3,
            tokens_per_s=len(tokens) / generation_s if generation_s > 0 and tokens else 0.0,
        ),
        logprobs=logprobs if params.logprobs else None,
        stop_string=stop_string,
    )
    yield Delta(tail, pending_tokens, pending_logprobs, finish_reason, result)
