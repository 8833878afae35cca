"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), so clients
written for Claude (the `anthropic` SDK, Claude-compatible tools) work unchanged: `system`,
`messages` with text blocks (a trailing assistant message is continued, as Anthropic's API
continues it), `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k`,
and `stream` with its events (message_start, content_block_start, ping, content_block_delta,
content_block_stop, message_delta, message_stop). The API key may come as `x-api-key`, as
Anthropic clients send it (app.py). Errors have Anthropic's shape,
{"type": "error", "error": {"type", "message"}}. Tool use is a 400 naming tool calling until
ember has it.

A request is translated to a chat-completions body and runs on the chat path
(generation.prepare_chat, generation.respond); this module only shapes the answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.results import Delta, GenerationResult
from ember.server import generation
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, json_response
from ember.server.protocol import Fields, show

_ROLES = {"user", "assistant"}


def anthropic_error(error: APIError) -> dict[str, Any]:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 503: "overloaded_error"}.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, block in enumerate(value):
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind in ("tool_use", "tool_result"):
                raise bad_request(f"'{where}[{j}]': tool use is not supported by this server "
                                  "yet", param=where, code="unsupported_parameter")
            if kind != "text" or not isinstance(block.get("text"), str):
                raise bad_request(f"'{where}[{j}]': only text blocks ({{\"type\": \"text\", "
                                  f"\"text\": ...}}) are supported, got {show(kind)}",
                                  param=where, code="unsupported_content")
            texts.append(block["text"])
        return "\n".join(texts)
    raise bad_request(f"'{where}' must be a string or an array of text blocks", param=where,
                      code="invalid_type")


def chat_body(body: Fields) -> dict[str, Any]:
    """The Messages request as a chat-completions body."""
    if body.get("tools"):
        raise bad_request("'tools': tool use is not supported by this server yet",
                          param="tools", code="unsupported_parameter")
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        raise bad_request("'thinking': extended thinking is not supported by this server",
                          param="thinking", code="unsupported_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", param="messages",
                          code="invalid_type" if not isinstance(messages, list)
                          else "invalid_value")
    chat_messages = []
    system = body.get("system")
    if system is not None:
        chat_messages.append({"role": "system", "content": _text(system, "system")})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in _ROLES:
            raise bad_request(f"'{where}.role' must be 'user' or 'assistant', got {show(role)}",
                              param=f"{where}.role", code="invalid_value")
        chat_messages.append({"role": role,
                              "content": _text(message.get("content"), f"{where}.content")})
    chat: dict[str, Any] = {"messages": chat_messages, "stream": body.boolean("stream")}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"),
                         ("top_k", "top_k"), ("stop", "stop_sequences")):
        if body.get(theirs) is not None:
            chat[ours] = body.get(theirs)
    return chat


class MessagesShape:
    def __init__(self, model: str) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self._model = model
        self._text: list[str] = []
        self._result: GenerationResult | None = None
        self.n_prompt_tokens = 0

    def _stop(self) -> tuple[str | None, str | None]:
        result = self._result
        if result is None:
            return None, None
        if result.finish_reason == "length":
            return "max_tokens", None
        if result.stop_string is not None:
            return "stop_sequence", result.stop_string
        return "end_turn", None

    def _usage(self) -> dict[str, Any]:
        u = self._result.usage if self._result is not None else None
        return {"input_tokens": u.prompt_tokens - u.cached_tokens if u else self.n_prompt_tokens,
                "cache_read_input_tokens": u.cached_tokens if u else 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": u.completion_tokens if u else 0}

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        stop_reason, stop_sequence = self._stop()
        return {"id": self.id, "type": "message", "role": "assistant", "model": self._model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": self._usage()}

    def add(self, index: int, delta: Delta) -> None:
        self._text.append(delta.text)
        if delta.result is not None:
            self._result = delta.result

    def response(self) -> dict[str, Any]:
        return self._message([{"type": "text", "text": "".join(self._text)}])

    def stream_start(self) -> list[bytes]:
        sse = generation.sse
        return [sse({"type": "message_start", "message": self._message([])}, "message_start"),
                sse({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}, "content_block_start"),
                sse({"type": "ping"}, "ping")]

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        sse = generation.sse
        out = []
        if delta.text:
            out.append(sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": delta.text}},
                           "content_block_delta"))
        if delta.result is not None:
            self._result = delta.result
            stop_reason, stop_sequence = self._stop()
            out += [sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                    sse({"type": "message_delta",
                         "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                         "usage": {"output_tokens": delta.result.usage.completion_tokens}},
                        "message_delta"),
                    sse({"type": "message_stop"}, "message_stop")]
        return out

    def stream_end(self) -> list[bytes]:
        return []

    def stream_error(self, error: APIError) -> list[bytes]:
        return [generation.sse(anthropic_error(error), "error")]


async def _messages(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    raw = await ctx.read_json(request)
    ctx.require_ready()
    body = Fields(raw)
    max_tokens = body.integer("max_tokens", low=1)
    if max_tokens is None:
        raise bad_request("'max_tokens' is required", param="max_tokens",
                          code="missing_required")
    chat = {**chat_body(body), "max_tokens": max_tokens}
    parsed, prompt = await generation.prepare_chat(request, ctx, chat)
    options = parsed.options
    shape = MessagesShape(ctx.check_model(body.string("model")))
    shape.n_prompt_tokens = len(prompt.tokens)
    return await generation.respond(request, ctx, shape, [prompt.tokens],
                                    [options.choice_params(0)],
                                    options.stream, arrival)


async def _count_tokens(request: HTTPRequest, ctx: AppContext) -> Response:
    raw = await ctx.read_json(request)
    ctx.require_ready()
    chat = {**chat_body(Fields(raw)), "max_tokens": 1, "stream": False}
    _, prompt = await generation.prepare_chat(request, ctx, chat)
    return json_response({"input_tokens": len(prompt.tokens)})


def _anthropic_errors(handler: Any) -> Any:
    async def endpoint(request: HTTPRequest, ctx: AppContext) -> Response:
        try:
            return await handler(request, ctx)
        except APIError as err:
            return json_response(anthropic_error(err), err.status, err.headers())

    return endpoint


messages = _anthropic_errors(_messages)
count_tokens = _anthropic_errors(_count_tokens)
