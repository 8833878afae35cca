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
(prompts.chat_request: the tools go through the chat template, the answer is read for calls
by ember.tools.calls, as chat completions do; respond.respond); this module only translates
and shapes the answer. Its routes answer errors in Anthropic's shape (anthropic_error, app.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.images import ImageRef
from ember.openai_format import dropped_fields
from ember.server.answer_parts import Part, PartsShape
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, json_response
from ember.server.fields import Fields, show, wrong_type
from ember.server.prompts import ChatPrompt, chat_request
from ember.server.reasoning import is_reasoning_template
from ember.server.respond import Generation, respond, sse

_ROLES = {"user", "assistant"}


def anthropic_error(error: APIError) -> dict[str, Any]:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 503: "overloaded_error"}.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _block_text(block: Any, at: str, param: str) -> str:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind != "text" or not isinstance(block.get("text"), str):
        raise bad_request(f"'{at}': only text blocks ({{\"type\": \"text\", \"text\": ...}}) "
                          f"are supported here, got {show(kind)}", param=param,
                          code="unsupported_content")
    return block["text"]


def _text_blocks(blocks: list[Any], where: str) -> str:
    return "\n".join(_block_text(b, f"{where}[{j}]", where) for j, b in enumerate(blocks))


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _text_blocks(value, where)
    raise bad_request(f"'{where}' must be a string or an array of text blocks", param=where,
                      code="invalid_type")


def _image(block: Mapping[str, Any], at: str, role: str) -> ImageRef:
    """An image block, {"type": "image", "source": {"type": "base64", "media_type": ...,
    "data": ...}} or {"type": "url", "url": ...}, as the ImageRef of its data URL or URL."""
    if role != "user":
        raise bad_request(f"'{at}': images go in user messages, not in {role} ones", param=at,
                          code="unsupported_content")
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    item = Fields(source, f"{at}.source") if isinstance(source, Mapping) else None
    if item is not None and kind == "base64":
        media_type = item.required_string("media_type")
        return ImageRef(f"data:{media_type};base64,{item.required_string('data')}", at)
    if item is not None and kind == "url":
        return ImageRef(item.required_string("url"), at)
    raise bad_request(f"'{at}.source' must be {{\"type\": \"base64\", \"media_type\": ..., "
                      f"\"data\": ...}} or {{\"type\": \"url\", \"url\": ...}}, got "
                      f"{show(kind)}", param=f"{at}.source",
                      code="unsupported_content" if kind == "file" else "invalid_value")


def _content(parts: list[str | ImageRef]) -> str | list[Any]:
    """Text blocks joined with "\n"; with images among them, chat content parts."""
    if all(isinstance(p, str) for p in parts):
        return "\n".join(parts)  # type: ignore[arg-type]
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


def _message(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Messages message as chat messages, blocks in order: text blocks (joined with
    "\n") and image blocks (a user's: ImageRefs among text parts); an assistant's tool_use
    blocks as its tool_calls; a user's tool_result blocks as "tool" messages (text around
    them stays user messages)."""
    if not isinstance(content, list):
        return [{"role": role, "content": _text(content, where)}]
    out: list[dict[str, Any]] = []
    texts: list[str | ImageRef] = []  # the text and image blocks of the message being built

    def flush() -> None:
        if texts:
            out.append({"role": role, "content": _content(texts)})
            texts.clear()

    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = f"{where}[{j}]"
        if kind == "tool_use" and role == "assistant":
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping):
                raise wrong_type(f"{at}.input", "an object", arguments)
            item = Fields(block, at)
            call = {"id": item.required_string("id"), "type": "function",
                    "function": {"name": item.required_string("name"),
                                 "arguments": json.dumps(arguments, ensure_ascii=False)}}
            if texts:
                out.append({"role": role, "content": _content(texts), "tool_calls": [call]})
                texts.clear()
            elif out and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": role, "content": "", "tool_calls": [call]})
        elif kind == "tool_result" and role == "user":
            flush()
            result = block.get("content")
            call_id = Fields(block, at).required_string("tool_use_id")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": "" if result is None else _text(result, f"{at}.content")})
        elif kind == "image":
            texts.append(_image(block, at, role))
        else:
            texts.append(_block_text(block, at, where))
    flush()
    return out


def _tools(body: Fields) -> list[dict[str, Any]] | None:
    """Messages' tools ({"name", "description"?, "input_schema"}) in chat's shape; ember.tools.request
    checks them further. Server tools (a "type" other than "custom") are a 400."""
    value = body.array("tools", "an array of {\"name\", \"description\", \"input_schema\"}")
    if value is None:
        return None
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


def _thinking(value: Any) -> int | bool | None:
    """`thinking`: {"type": "enabled", "budget_tokens": N} (N), {"type": "disabled"} (False),
    or None when absent."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "disabled":
        return False
    if kind != "enabled":
        raise bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or "
                          f"{{\"type\": \"disabled\"}}, got {show(value)}", param="thinking",
                          code="invalid_value")
    budget = Fields(value, "thinking").integer("budget_tokens", low=0)
    if budget is None:
        raise bad_request("'thinking.budget_tokens' is required", param="thinking.budget_tokens",
                          code="missing_required")
    return budget


def chat_body(body: Fields) -> dict[str, Any]:
    """The Messages request as a chat-completions body."""
    thinking = _thinking(body.get("thinking"))
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
                            "tools": _tools(body), "tool_choice": tool_choice,
                            "parallel_tool_calls": parallel}
    if thinking is False:
        chat["chat_template_kwargs"] = {"enable_thinking": False}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"),
                         ("top_k", "top_k"), ("stop", "stop_sequences")):
        if body.get(theirs) is not None:
            chat[ours] = body.get(theirs)
    return chat


def _block(part: Part) -> dict[str, Any]:
    """A content block: text (a text part), thinking (a reasoning part; ember signs nothing,
    so its signature is empty) or tool_use (a call part, its input parsed)."""
    if part.kind == "text":
        return {"type": "text", "text": part.text}
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": part.text, "signature": ""}
    try:
        arguments = json.loads(part.text)
    except ValueError:  # cut short (max_tokens)
        arguments = None
    return {"type": "tool_use", "id": part.id, "name": part.name,
            "input": arguments if isinstance(arguments, dict) else {}}


class MessagesShape(PartsShape):
    """The Message object and its stream events; its content blocks are the answer's parts
    (answer_parts.py): text, and a tool_use block per call."""

    def __init__(self, model: str, prompt: ChatPrompt) -> None:
        super().__init__(prompt)
        self.id = f"msg_{uuid.uuid4().hex}"
        self._model = model
        self._pinged = False
        self.n_prompt_tokens = len(prompt.tokens)

    def _stop(self) -> tuple[str | None, str | None]:
        result = self.result
        if result is None:
            return None, None
        if result.finish_reason == "length":
            return "max_tokens", None
        if result.stop_string is not None:
            return "stop_sequence", result.stop_string
        return ("tool_use" if self.calls else "end_turn"), None

    def _usage(self) -> dict[str, Any]:
        u = self.result.usage if self.result is not None else None
        return {"input_tokens": u.prompt_tokens - u.cached_tokens if u else self.n_prompt_tokens,
                "cache_read_input_tokens": u.cached_tokens if u else 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": u.completion_tokens if u else 0,
                **(dropped_fields(u) if u else {})}

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        stop_reason, stop_sequence = self._stop()
        return {"id": self.id, "type": "message", "role": "assistant", "model": self._model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": self._usage()}

    # --- PartsShape ------------------------------------------------------------------------

    def new_text(self) -> Part:
        return Part("text", "")

    def new_reasoning(self) -> Part:
        return Part("reasoning", "")

    def new_call(self, name: str) -> Part:
        # Mistral's templates need their 9-character ids given back; others get toolu_ ids.
        return Part("call", self.fresh_call_id().replace("call_", "toolu_", 1), name=name)

    def opened(self, part: Part) -> list[bytes]:
        start = {"type": "text", "text": ""} if part.kind == "text" else {
            "type": "thinking", "thinking": "", "signature": ""} if part.kind == "reasoning" \
            else {"type": "tool_use", "id": part.id, "name": part.name, "input": {}}
        out = [sse({"type": "content_block_start", "index": self.index(part),
                               "content_block": start}, "content_block_start")]
        if not self._pinged:  # where Anthropic's streams send it
            self._pinged = True
            out.append(sse({"type": "ping"}, "ping"))
        return out

    def grew(self, part: Part, text: str) -> list[bytes]:
        delta = {"type": "text_delta", "text": text} if part.kind == "text" else {
            "type": "thinking_delta", "thinking": text} if part.kind == "reasoning" else {
            "type": "input_json_delta", "partial_json": text}
        return [sse({"type": "content_block_delta", "index": self.index(part),
                                "delta": delta}, "content_block_delta")]

    def closed(self, part: Part) -> list[bytes]:
        return [sse({"type": "content_block_stop", "index": self.index(part)},
                               "content_block_stop")]

    def ended(self) -> list[bytes]:
        stop_reason, stop_sequence = self._stop()
        return [sse({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {key: value for key, value in self._usage().items()
                      if key in ("output_tokens", "dropped_tokens", "dropped_messages")}},
            "message_delta"),
            sse({"type": "message_stop"}, "message_stop")]

    # --- respond.Shape ---------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        return self._message([_block(part) for part in self.parts])

    def stream_start(self) -> list[bytes]:
        return [sse({"type": "message_start", "message": self._message([])},
                               "message_start")]

    def stream_error(self, error: APIError) -> list[bytes]:
        return [sse(anthropic_error(error), "error")]


async def messages(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    raw = await ctx.read_json(request)
    ctx.require_ready()
    body = Fields(raw)
    max_tokens = body.integer("max_tokens", low=1)
    if max_tokens is None:
        raise bad_request("'max_tokens' is required", param="max_tokens",
                          code="missing_required")
    chat = {**chat_body(body), "max_tokens": max_tokens}
    body.string("model")  # any name is answered by the served model
    thinking = _thinking(body.get("thinking"))
    budget = None if thinking is None or thinking is False else thinking
    if budget is not None:
        assert ctx.template is not None
        if not is_reasoning_template(ctx.template.source):
            raise bad_request("'thinking': this model does not think (its chat template has "
                              "no </think>)", param="thinking", code="unsupported_parameter")
        if budget >= max_tokens:
            raise bad_request(f"'thinking.budget_tokens' ({budget}) must be less than "
                              f"'max_tokens' ({max_tokens})", param="thinking.budget_tokens",
                              code="invalid_value")
    parsed, prompt = await chat_request(
        request, ctx, chat, thinking_budget=budget)
    options = parsed.options
    generation = Generation([prompt.tokens], [options.choice_params(0)], options.stream,
                            prompt.keep_tokens, [prompt.dropped], prompt.images)
    return await respond(request, ctx, MessagesShape(ctx.model_name, prompt), generation,
                         arrival)


async def count_tokens(request: HTTPRequest, ctx: AppContext) -> Response:
    raw = await ctx.read_json(request)
    ctx.require_ready()
    chat = {**chat_body(Fields(raw)), "max_tokens": 1, "stream": False}
    _, prompt = await chat_request(request, ctx, chat)
    return json_response({"input_tokens": len(prompt.tokens)})
