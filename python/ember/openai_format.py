"""OpenAI response objects and stream chunks for chat completions and completions — the one
place their shapes are written, used by ember.LLM's create_* methods and by the server.

One Formatter per request knows its id, model name and kind, and turns the engine's Deltas
(tagged with their choice index) into the dicts clients parse. Streams follow DESIGN.md:
chat starts each choice with a {"role": "assistant", "content": ""} delta, then content deltas,
then a chunk with finish_reason and an empty delta; with include_usage one more chunk with
`choices: []` and the usage; the caller ends with `data: [DONE]`.

With a tool format (a chat offering tools, see ember.tools.calls), each choice's text is parsed
for tool calls: `message.tool_calls` and finish_reason "tool_calls" when the model called one;
streams send `tool_calls` deltas (index, id, type and name first, then argument fragments) and
hold back text that may still become a call.
"""

from __future__ import annotations

import math
import secrets
import string
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ember.build_info import build_info
from ember.results import Delta, TokenLogprob, Usage
from ember.tools.calls import CallDelta, ToolCallStream, ToolFormat, parse


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
    usage.update(dropped_fields(first))
    return usage


def dropped_fields(usage: Usage) -> dict[str, int]:
    """ember's usage fields for what fitting the prompt into the context left out
    (ember.context_fit): dropped_tokens and dropped_messages, only when something was."""
    if not (usage.dropped_tokens or usage.dropped_messages):
        return {}
    return {"dropped_tokens": usage.dropped_tokens, "dropped_messages": usage.dropped_messages}


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
    if any("dropped_tokens" in p for p in parts):
        for key in ("dropped_tokens", "dropped_messages"):
            usage[key] = sum(p.get(key, 0) for p in parts)
    return usage


def chat_logprobs(entries: Sequence[TokenLogprob], post_sampling: bool = False) -> dict[str, Any]:
    """OpenAI's logprobs; with post_sampling (llama-server's post_sampling_probs) its shape:
    probabilities after the sampler chain as `prob` and `top_probs`, with token ids."""
    if post_sampling:
        def one(e: TokenLogprob) -> dict[str, Any]:
            return {"id": e.token, "token": e.text, "bytes": list(e.bytes),
                    "prob": math.exp(e.logprob)}

        return {"content": [{**one(e), "top_probs": [one(t) for t in e.top]} for e in entries]}
    return {"content": [{
        "token": e.text, "logprob": e.logprob, "bytes": list(e.bytes),
        "top_logprobs": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.bytes)}
                         for t in e.top],
    } for e in entries]}


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """An echoed prompt's first token has logprob None, and so top_logprobs None."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": [e.text for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.text: t.logprob for t in e.top} if e.logprob is not None
                             else None for e in entries],
            "text_offset": offsets}


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    n_chars: int = 0  # text streamed so far (completions' text_offset)
    echo: tuple[str, list[TokenLogprob]] | None = None  # the prompt, before the completion
    tools: ToolCallStream | None = None  # parses the streamed text for tool calls
    call_ids: list[str] = field(default_factory=list)


def call_id(fmt: ToolFormat) -> str:
    """A fresh tool-call id: OpenAI's shape, or the 9 letters and digits Mistral's templates
    require of the ids they are given back."""
    if fmt.name == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return f"call_{uuid.uuid4().hex[:24]}"


def _finish_reason(reason: str | None, n_calls: int) -> str | None:
    return "tool_calls" if n_calls and reason == "stop" else reason


class Formatter:
    """Builds the chunks and the final response of one request with `n_choices` choices.
    `usage_groups` groups choice indices that share a prompt (completions with several
    prompts); by default all choices share one."""

    def __init__(self, chat: bool, model: str, n_choices: int, logprobs: bool,
                 usage_groups: list[list[int]] | None = None,
                 tool_format: ToolFormat | None = None, answer_prefix: str = "",
                 post_sampling: bool = False) -> None:
        self.chat = chat
        self.post_sampling = post_sampling  # chat logprobs as llama-server's post-sampling probs
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs
        self.choices = [_Choice() for _ in range(n_choices)]
        self.usage_groups = usage_groups or [list(range(n_choices))]
        self.tool_format = tool_format if chat else None
        self.answer_prefix = answer_prefix  # text in the prompt that the answer continues

    def _head(self, stream: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": build_info()}

    def usage(self) -> dict[str, Any]:
        groups = [[u for i in g if (u := self.choices[i].usage) is not None]
                  for g in self.usage_groups]
        return merged_usage([g for g in groups if g])

    def echo(self, index: int, text: str, logprobs: list[TokenLogprob]) -> None:
        """Choice `index` starts with this text: completions' `echo` (the prompt, and its token
        logprobs when logprobs are asked for), or a chat reply's prefill."""
        self.choices[index].echo = (text, logprobs)

    # --- streaming -------------------------------------------------------------------------

    def first_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open every choice with the assistant role."""
        if not self.chat:
            return []
        return [self.opening_chunk(i) for i in range(len(self.choices))]

    def opening_chunk(self, index: int) -> dict[str, Any]:
        """A chunk with nothing generated yet: chat's assistant role, completions' empty text."""
        body: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": None}
        if self.chat:
            body["delta"] = {"role": "assistant", "content": ""}
        else:
            body["text"] = ""
        return {**self._head(True), "choices": [body]}

    def chunks(self, index: int, event: Delta) -> list[dict[str, Any]]:
        """The chunks for one event of choice `index`: its text (when there is any), then the
        finish chunk (when it is the last)."""
        choice = self.choices[index]
        if choice.echo is not None:  # the prompt goes first, in front of the first event
            text, prompt_logprobs = choice.echo
            choice.echo = None
            event = replace(event, text=text + event.text,
                            logprobs=[*prompt_logprobs, *event.logprobs])
        if self.tool_format is not None:
            return self._tool_chunks(index, choice, event)
        out = []
        logprobs = event.logprobs if self.logprobs else []
        if event.text or logprobs:
            if self.chat:
                out.append({**self._head(True), "choices": [{
                    "index": index, "delta": {"content": event.text},
                    "logprobs": chat_logprobs(logprobs, self.post_sampling) if self.logprobs else None,
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

    def reasoning_chunk(self, index: int, text: str) -> dict[str, Any]:
        """A chat chunk of a reasoning model's thinking (server/reasoning.py reads it out)."""
        return {**self._head(True), "choices": [{
            "index": index, "delta": {"reasoning_content": text}, "logprobs": None,
            "finish_reason": None}]}

    def _tool_chunks(self, index: int, choice: _Choice, event: Delta) -> list[dict[str, Any]]:
        assert self.tool_format is not None
        if choice.tools is None:
            choice.tools = ToolCallStream(self.tool_format, self.answer_prefix)
        content, calls = choice.tools.push(event.text)
        if event.finish_reason is not None:
            more_content, more_calls = choice.tools.finish()
            content, calls = content + more_content, calls + more_calls
        out = []
        logprobs = event.logprobs if self.logprobs else []
        if content or logprobs:
            out.append({**self._head(True), "choices": [{
                "index": index, "delta": {"content": content},
                "logprobs": chat_logprobs(logprobs, self.post_sampling) if self.logprobs else None,
                "finish_reason": None}]})
        if calls:
            out.append({**self._head(True), "choices": [{
                "index": index, "delta": {"tool_calls": [self._call_delta(choice, c)
                                                         for c in calls]},
                "logprobs": None, "finish_reason": None}]})
        if event.finish_reason is not None:
            choice.finish_reason = _finish_reason(event.finish_reason, len(choice.call_ids))
            choice.usage = event.result.usage if event.result else None
            out.append({**self._head(True), "choices": [{
                "index": index, "delta": {}, "logprobs": None,
                "finish_reason": choice.finish_reason}]})
        return out

    def _call_delta(self, choice: _Choice, delta: CallDelta) -> dict[str, Any]:
        assert self.tool_format is not None
        if delta.name is None:
            return {"index": delta.index, "function": {"arguments": delta.arguments}}
        choice.call_ids.append(call_id(self.tool_format))
        return {"index": delta.index, "id": choice.call_ids[delta.index], "type": "function",
                "function": {"name": delta.name, "arguments": delta.arguments}}

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
            logprobs = c.logprobs
            if c.echo is not None:
                text, logprobs = c.echo[0] + text, [*c.echo[1], *logprobs]
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                finish_reason = c.finish_reason
                if self.tool_format is not None:
                    parsed = parse(self.answer_prefix + text, self.tool_format)
                    if parsed.calls:
                        message["content"] = parsed.content or None
                        message["tool_calls"] = [{
                            "id": call_id(self.tool_format), "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        } for call in parsed.calls]
                        finish_reason = _finish_reason(finish_reason, len(parsed.calls))
                choices.append({"index": i, "message": message,
                                "logprobs": chat_logprobs(c.logprobs, self.post_sampling)
                                if self.logprobs else None,
                                "finish_reason": finish_reason})
            else:
                choices.append({"index": i, "text": text,
                                "logprobs": completion_logprobs(logprobs, 0)
                                if self.logprobs else None,
                                "finish_reason": c.finish_reason})
        return {**self._head(False), "choices": choices, "usage": self.usage()}
