"""OpenAI response objects and stream chunks for chat completions and completions — the one
place their shapes are written, used by ember.LLM's create_* methods and by the server.

One Formatter per request knows its id, model name and kind, and turns the engine's Deltas
(tagged with their choice index) into the dicts clients parse. Streams follow DESIGN.md:
chat starts each choice with a {"role": "assistant", "content": ""} delta, then content deltas,
then a chunk with finish_reason and an empty delta; with include_usage one more chunk with
`choices: []` and the usage; the caller ends with `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.results import Delta, TokenLogprob, Usage


def usage_dict(usages: Sequence[Usage]) -> dict[str, Any]:
    """OpenAI's usage of a request with one or more choices of the same prompt: the prompt
    counts once, completions add up; cached_tokens is the first choice's."""
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    usage: dict[str, Any] = {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }
    if any(u.accepted_prediction_tokens is not None for u in usages):  # Predicted Outputs
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(u.accepted_prediction_tokens or 0 for u in usages),
            "rejected_prediction_tokens": sum(u.rejected_prediction_tokens or 0 for u in usages),
        }
    return usage


def merged_usage(groups: Sequence[Sequence[Usage]]) -> dict[str, Any]:
    """The usage of a completions request with several prompts (each with its choices)."""
    parts = [usage_dict(g) for g in groups]
    prompt = sum(p["prompt_tokens"] for p in parts)
    completion = sum(p["completion_tokens"] for p in parts)
    cached = sum(p["prompt_tokens_details"]["cached_tokens"] for p in parts)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion,
                             "prompt_tokens_details": {"cached_tokens": cached}}
    details = [p["completion_tokens_details"] for p in parts if "completion_tokens_details" in p]
    if details:
        usage["completion_tokens_details"] = {
            key: sum(d[key] for d in details)
            for key in ("accepted_prediction_tokens", "rejected_prediction_tokens")}
    return usage


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [{
        "token": e.text, "logprob": e.logprob, "bytes": list(e.bytes),
        "top_logprobs": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.bytes)}
                         for t in e.top],
    } for e in entries]}


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": [e.text for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.text: t.logprob for t in e.top} for e in entries],
            "text_offset": offsets}


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    n_chars: int = 0  # text streamed so far (completions' text_offset)


class Formatter:
    """Builds the chunks and the final response of one request with `n_choices` choices.
    `usage_groups` groups choice indices that share a prompt (completions with several
    prompts); by default all choices share one."""

    def __init__(self, chat: bool, model: str, n_choices: int, logprobs: bool,
                 usage_groups: list[list[int]] | None = None) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs
        self.choices = [_Choice() for _ in range(n_choices)]
        self.usage_groups = usage_groups or [list(range(n_choices))]

    def _head(self, stream: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def usage(self) -> dict[str, Any]:
        groups = [[u for i in g if (u := self.choices[i].usage) is not None]
                  for g in self.usage_groups]
        return merged_usage([g for g in groups if g])

    # --- streaming -------------------------------------------------------------------------

    def first_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open every choice with the assistant role."""
        if not self.chat:
            return []
        return [{**self._head(True), "choices": [{
            "index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}]} for i in range(len(self.choices))]

    def chunks(self, index: int, event: Delta) -> list[dict[str, Any]]:
        """The chunks for one event of choice `index`: its text (when there is any), then the
        finish chunk (when it is the last)."""
        choice = self.choices[index]
        out = []
        logprobs = event.logprobs if self.logprobs else []
        if event.text or logprobs:
            if self.chat:
                out.append({**self._head(True), "choices": [{
                    "index": index, "delta": {"content": event.text},
                    "logprobs": chat_logprobs(logprobs) if self.logprobs else None,
                    "finish_reason": None}]})
            else:
                out.append({**self._head(True), "choices": [{
                    "index": index, "text": event.text,
                    "logprobs": completion_logprobs(logprobs, choice.n_chars)
                    if self.logprobs else None,
                    "finish_reason": None}]})
            choice.n_chars += len(event.text)
        if event.finish_reason is not None:
            choice.finish_reason = event.finish_reason
            choice.usage = event.result.usage if event.result else None
            body: dict[str, Any] = {"index": index, "logprobs": None,
                                    "finish_reason": event.finish_reason}
            if self.chat:
                body["delta"] = {}
            else:
                body["text"] = ""
            out.append({**self._head(True), "choices": [body]})
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": self.usage()}

    # --- whole responses -------------------------------------------------------------------

    def add(self, index: int, event: Delta) -> None:
        choice = self.choices[index]
        choice.text.append(event.text)
        choice.logprobs.extend(event.logprobs)
        if event.finish_reason is not None:
            choice.finish_reason = event.finish_reason
            choice.usage = event.result.usage if event.result else None

    def response(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            text = "".join(c.text)
            if self.chat:
                choices.append({"index": i,
                                "message": {"role": "assistant", "content": text},
                                "logprobs": chat_logprobs(c.logprobs) if self.logprobs else None,
                                "finish_reason": c.finish_reason})
            else:
                choices.append({"index": i, "text": text,
                                "logprobs": completion_logprobs(c.logprobs, 0)
                                if self.logprobs else None,
                                "finish_reason": c.finish_reason})
        return {**self._head(False), "choices": choices, "usage": self.usage()}
