"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), so clients
written for Claude (the `anthropic` SDK, Claude-compatible tools) work unchanged: `system`,
`messages` with text blocks (a trailing assistant message is continued, as Anthropic's API
continues it), `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k`,
tool use (`tools` with name, description and input_schema; `tool_choice` auto / any / tool /
none and disable_parallel_tool_use; `tool_use` blocks in the answer with stop_reason
"tool_use"; `tool_result` blocks in user messages), and `stream` with its events
(message_start, content_block_start, ping, content_block_delta with text_delta or
input_json_delta, content_block_stop, message_delta, message_stop). The API key may come as
`x-api-key`, as Anthropic clients send it (app.py). Errors have Anthropic's shape,
{"type": "error", "error": {"type", "message"}}. Server tools (Anthropic's bash, web search,
...) are a 400.

A request is translated to a chat-completions body and runs on the chat path
(generation.prepare_chat: the tools go through the chat template, the answer is read for calls
by ember.tool_calls, as chat completions do; generation.respond); this module only translates
and shapes the answer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.openai_format import call_id
from ember.results import Delta, GenerationResult
from ember.server import generation
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, json_response
from ember.server.generation import ChatPrompt
from ember.server.protocol import Fields, show
from ember.tool_calls import CallDelta, ToolCallStream

_ROLES = {"user", "assistant"}


def anthropic_error(error: APIError) -> dict[str, Any]:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 503: "overloaded_error"}.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _text_blocks(blocks: list[Any], where: str) -> str:
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise bad_request(f"'{where}[{j}]': only text blocks ({{\"type\": \"text\", "
                              f"\"text\": ...}}) are supported here, got {show(kind)}",
                              param=where, code="unsupported_content")
        texts.append(block["text"])
    return "\n".join(texts)


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _text_blocks(value, where)
    raise bad_request(f"'{where}' must be a string or an array of text blocks", param=where,
                      code="invalid_type")


def _block_string(block: Mapping[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise bad_request(f"'{where}.{key}' must be a string, got {show(value)}",
                          param=f"{where}.{key}", code="invalid_type")
    return value


def _message(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Messages message as chat messages, blocks in order: text blocks (joined with
    "\n"); an assistant's tool_use blocks as its tool_calls; a user's tool_result blocks as
    "tool" messages (text around them stays user messages)."""
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content, where)}]
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []  # the text blocks of the chat message being built

    def flush() -> None:
        if texts:
            out.append({"role": role, "content": _text_blocks(texts, where)})
            texts.clear()

    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}[{j}]"
        if kind == "tool_use" and role == "assistant":
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping):
                raise bad_request(f"'{at}.input' must be an object", param=f"{at}.input",
                                  code="invalid_type")
            call = {"id": _block_string(block, "id", at), "type": "function",
                    "function": {"name": _block_string(block, "name", at),
                                 "arguments": json.dumps(arguments, ensure_ascii=False)}}
            if texts:
                out.append({"role": role, "content": _text_blocks(texts, where),
                            "tool_calls": [call]})
                texts.clear()
            elif out and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": role, "content": "", "tool_calls": [call]})
        elif kind == "tool_result" and role == "user":
            flush()
            result = block.get("content")
            out.append({"role": "tool", "tool_call_id": _block_string(block, "tool_use_id", at),
                        "content": "" if result is None else _text(result, f"{at}.content")})
        else:
            texts.append(block)
    flush()
    return out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Messages' tools ({"name", "description"?, "input_schema"}) in chat's shape; ember.tools
    checks them further. Server tools (a "type" other than "custom") are a 400."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be an array of {\"name\", \"description\", "
                          "\"input_schema\"}", param="tools", code="invalid_type")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad_request(f"'{where}' must be an object", param=where, code="invalid_type")
        if tool.get("type", "custom") != "custom":
            raise bad_request(f"'{where}': Anthropic's server tools (type "
                              f"{show(tool.get('type'))}) are not supported; give client tools "
                              "(name, description, input_schema)", param=where,
                              code="unsupported_parameter")
        schema = tool.get("input_schema")
        if not isinstance(schema, Mapping):
            raise bad_request(f"'{where}.input_schema' must be a JSON schema object, got "
                              f"{show(schema)}", param=f"{where}.input_schema",
                              code="invalid_type")
        function = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = tool.get("description")
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """Messages' tool_choice as chat's (tool_choice, parallel_tool_calls)."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | "
                          f"\"none\", ...}}, got {show(value)}", param="tool_choice",
                          code="invalid_value")
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean",
                          param="tool_choice", code="invalid_type")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {
        "type": "function", "function": {"name": value.get("name")}}
    return choice, None if disable is None else not disable


def chat_body(body: Fields) -> dict[str, Any]:
    """The Messages request as a chat-completions body."""
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
        chat_messages += _message(role, message.get("content"), f"{where}.content")
    tool_choice, parallel = _tool_choice(body.get("tool_choice"))
    chat: dict[str, Any] = {"messages": chat_messages, "stream": body.boolean("stream"),
                            "tools": _tools(body.get("tools")), "tool_choice": tool_choice,
                            "parallel_tool_calls": parallel}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"),
                         ("top_k", "top_k"), ("stop", "stop_sequences")):
        if body.get(theirs) is not None:
            chat[ours] = body.get(theirs)
    return chat


@dataclass
class _Block:
    """A content block of the answer: text, or a tool_use (name, and its input's JSON text)."""

    kind: str  # "text" or "tool_use"
    text: str = ""  # the text; a tool_use's input as JSON text
    id: str = ""
    name: str = ""
    done: bool = False

    def json(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": self.text}
        try:
            arguments = json.loads(self.text)
        except ValueError:  # cut short (max_tokens)
            arguments = None
        return {"type": "tool_use", "id": self.id, "name": self.name,
                "input": arguments if isinstance(arguments, dict) else {}}


class MessagesShape:
    """The Message object and its stream events. The answer is read as it arrives (for tool
    calls when the request offered tools), so a stream and a whole response hold the same
    blocks: text, and a tool_use block per call, in the order written."""

    def __init__(self, model: str, prompt: ChatPrompt) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self._model = model
        self._tools = ToolCallStream(prompt.tool_format, prompt.answer_prefix) \
            if prompt.tool_format is not None else None
        self._call_id_format = prompt.tool_format
        self._blocks: list[_Block] = []
        self._calls: list[_Block] = []  # the tool_use blocks, by call index
        self._result: GenerationResult | None = None
        self._pinged = False
        self.n_prompt_tokens = len(prompt.tokens)

    def _stop(self) -> tuple[str | None, str | None]:
        result = self._result
        if result is None:
            return None, None
        if result.finish_reason == "length":
            return "max_tokens", None
        if result.stop_string is not None:
            return "stop_sequence", result.stop_string
        return ("tool_use" if self._calls else "end_turn"), None

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

    # --- blocks, as the answer grows ---------------------------------------------------------

    def _open(self, block: _Block) -> list[bytes]:
        out = self._close()
        self._blocks.append(block)
        start = {"type": "text", "text": ""} if block.kind == "text" else {
            "type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        out.append(generation.sse({"type": "content_block_start",
                                   "index": len(self._blocks) - 1, "content_block": start},
                                  "content_block_start"))
        if not self._pinged:  # where Anthropic's streams send it
            self._pinged = True
            out.append(generation.sse({"type": "ping"}, "ping"))
        return out

    def _close(self) -> list[bytes]:
        if not self._blocks or self._blocks[-1].done:
            return []
        self._blocks[-1].done = True
        return [generation.sse({"type": "content_block_stop", "index": len(self._blocks) - 1},
                               "content_block_stop")]

    def _delta(self, block: _Block, delta: dict[str, Any]) -> bytes:
        return generation.sse({"type": "content_block_delta",
                               "index": self._blocks.index(block), "delta": delta},
                              "content_block_delta")

    def _content(self, text: str) -> list[bytes]:
        out = []
        if not self._blocks or self._blocks[-1].kind != "text":
            out += self._open(_Block("text"))
        block = self._blocks[-1]
        block.text += text
        return [*out, self._delta(block, {"type": "text_delta", "text": text})]

    def _call(self, delta: CallDelta) -> list[bytes]:
        out = []
        if delta.name is not None:
            assert self._call_id_format is not None
            # Mistral's templates need their 9-character ids given back; others get toolu_ ids.
            cid = call_id(self._call_id_format)
            self._calls.append(_Block("tool_use", id=cid.replace("call_", "toolu_", 1),
                                      name=delta.name))
            out += self._open(self._calls[-1])
        block = self._calls[delta.index]
        if delta.arguments:
            block.text += delta.arguments
            out.append(self._delta(block, {"type": "input_json_delta",
                                           "partial_json": delta.arguments}))
        return out

    def _feed(self, delta: Delta) -> list[bytes]:
        final = delta.result is not None
        content, calls = self._tools.push(delta.text, final) if self._tools is not None \
            else (delta.text, [])
        out = self._content(content) if content else []
        for call in calls:
            out += self._call(call)
        if final:
            self._result = delta.result
            if not self._blocks:  # an empty answer is an empty text block
                out += self._open(_Block("text"))
            out += self._close()
            stop_reason, stop_sequence = self._stop()
            out += [generation.sse({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"output_tokens": self._usage()["output_tokens"]}}, "message_delta"),
                generation.sse({"type": "message_stop"}, "message_stop")]
        return out

    # --- Shape -------------------------------------------------------------------------------

    def add(self, index: int, delta: Delta) -> None:
        self._feed(delta)

    def response(self) -> dict[str, Any]:
        return self._message([block.json() for block in self._blocks])

    def stream_start(self) -> list[bytes]:
        return [generation.sse({"type": "message_start", "message": self._message([])},
                               "message_start")]

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        return self._feed(delta)

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
    shape = MessagesShape(ctx.check_model(body.string("model")), prompt)
    return await generation.respond(request, ctx, shape, [prompt.tokens],
                                    [options.choice_params(0)], options.stream, arrival,
                                    prompt.keep_tokens)


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
