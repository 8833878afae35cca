"""Prompt scoring for /v1/completions' `echo` + `logprobs`: the log-probability of every prompt
token given the ones before it, which is how evaluation harnesses (lm-evaluation-harness's
local-completions: echo, logprobs, max_tokens 0) score log-likelihoods.

The engine samples only each sequence's last row, so prompt rows have no logits there. Scoring
runs on an ember.Model of the same file instead — the same forward pass ember.Model.eval runs,
with the engine's own log-softmax (ember._core.token_logprobs) — loaded on the first scoring
request (a second copy of the weights the CPU backend repacks), one prompt at a time, in a
worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from ember import _core
from ember.results import TokenLogprob


class PromptScorer:
    def __init__(self, path: Path, n_threads: int | None, n_ctx: int,
                 tokenizer: _core.Tokenizer) -> None:
        self._path, self._n_threads, self._n_ctx = path, n_threads, n_ctx
        self._tokenizer = tokenizer
        self._model: _core.Model | None = None
        self._lock = threading.Lock()  # one Model, one sequence's cache: one prompt at a time

    async def score(self, tokens: list[int], n_top: int) -> list[TokenLogprob]:
        """One entry per prompt token; the first has logprob None (nothing predicts it)."""
        return await asyncio.to_thread(self._score, tokens, n_top)

    def _score(self, tokens: list[int], n_top: int) -> list[TokenLogprob]:
        with self._lock:
            if self._model is None:
                self._model = _core.Model(str(self._path), n_threads=self._n_threads,
                                          n_ctx=self._n_ctx)
            logits = self._model.eval(tokens)  # [n_tokens, n_vocab]: row i predicts token i + 1
        out = [self._entry(tokens[0], None)]
        for i in range(1, len(tokens)):
            logprob, top = _core.token_logprobs(logits[i - 1], tokens[i], n_top)
            entry = self._entry(tokens[i], logprob)
            entry.top = [self._entry(t, v) for t, v in top]
            out.append(entry)
        return out

    def _entry(self, token: int, logprob: float | None) -> TokenLogprob:
        raw = self._tokenizer.token_to_piece(token)
        return TokenLogprob(token, raw.decode("utf-8", errors="replace"), raw,
                            logprob)  # type: ignore[arg-type]  # None: the first prompt token
