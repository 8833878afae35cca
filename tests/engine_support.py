"""Driving ember._core.Engine in tests: prompts, submitting them all at once, collecting every
request's events, and the single-sequence greedy loop the engine's output is compared with."""

from __future__ import annotations

import time

import numpy as np

from ember import _core


def reference_greedy(model: _core.Model, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the single-sequence loop on a contiguous cache (no engine)."""
    logits = model.eval_last(prompt, reset=True)
    out: list[int] = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = model.eval_last([token], reset=False)
    return out


def prompts_of(n_vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """One random prompt of each length, BOS (id 1) first, the rest from ids 3 up."""
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, n_vocab, size=n - 1).tolist()] for n in lengths]


def submit(engine: _core.Engine, prompt: list[int], *, max_tokens: int = 256, logprobs: int = -1,
           **sampling: object) -> _core.EngineRequest:
    """ember._core.Engine.submit with the sampling fields as keywords."""
    return engine.submit(prompt, _core.SamplingParams(**sampling), max_tokens=max_tokens, logprobs=logprobs)


def run_all(engine: _core.Engine, prompts: list[list[int]], max_tokens: int, **kw) -> list[list]:
    """Submits every prompt at once; every request's events, in order."""
    handles = [submit(engine, p, max_tokens=max_tokens, temperature=0.0, **kw) for p in prompts]
    events = []
    for h in handles:
        got = []
        while not h.done:
            got += h.next_events(60.0)
        events.append(got)
    return events


def settled_stats(engine: _core.Engine) -> dict:
    """Stats once the engine has published the step that finished the last request (events
    reach their streams just before the step's stats are published)."""
    deadline = time.monotonic() + 10
    stats = engine.stats()
    while (stats["running"] or stats["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.005)
        stats = engine.stats()
    return stats


def tokens_of(events: list) -> list[int]:
    return [e.token for e in events if e.token is not None]
