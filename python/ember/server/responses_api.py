"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}), used by the OpenAI
Agents SDK and coding agents: `input` as a string or message items, `instructions`,
`max_output_tokens`, `temperature`, `top_p`, `stream` with the Responses event sequence
(response.created ... response.completed). Stateless unless `store: true` is asked for; stored
responses (response_store.py) can be continued with `previous_response_id`. `text.format`
(json_object, json_schema) is enforced by constrained decoding, as chat's response_format;
function tools are a 400 (tool calling is wired into chat completions, not yet into this API).

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
from ember.server.protocol import Fields, Options, show

_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise bad_request(f"'{where}.content[{j}]': only text parts (input_text, "
                                  f"output_text) are supported, got {show(kind)}",
                                  param=f"{where}.content", code="unsupported_content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"'{where}.content' must be a string or an array of text parts",
                      param=f"{where}.content", code="invalid_type")


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; items are messages
    ({"role", "content"}, with or without "type": "message")."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of message items",
                          param="input", code="invalid_type")
    out = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"'{where}' must be an object", param=where, code="invalid_type")
        kind = item.get("type", "message")
        if kind != "message":
            what = "tool calling" if "function" in str(kind) else f"items of type {show(kind)}"
            raise bad_request(f"'{where}': {what} is not supported by this server yet (only "
                              "message items are)", param=where, code="unsupported_parameter")
        role = item.get("role")
        if role not in _ROLES:
            raise bad_request(f"'{where}.role' must be one of {sorted(_ROLES)}, got {show(role)}",
                              param=f"{where}.role", code="invalid_value")
        out.append({"role": role, "content": _content(item.get("content"), where)})
    return out


def _check_unsupported(body: Fields) -> None:
    if body.get("tools"):
        raise bad_request("'tools': tool calling is not supported by this server yet",
                          param="tools", code="unsupported_parameter")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") not in (None, "none"):
        raise bad_request("'reasoning': reasoning effort is not supported by this server",
                          param="reasoning", code="unsupported_parameter")


class ResponsesShape:
    """The Response object and its stream events."""

    def __init__(self, model: str, options: Options, echo: dict[str, Any]) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self._item_id = f"msg_{uuid.uuid4().hex}"
        self._model = model
        self._created = int(time.time())
        self._echo = echo  # the request's fields a Response repeats
        self._text: list[str] = []
        self._result: GenerationResult | None = None
        self._seq = 0

    def _message(self, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [
            {"type": "output_text", "text": "".join(self._text), "annotations": []}]
        return {"type": "message", "id": self._item_id, "status": status, "role": "assistant",
                "content": content}

    def _response(self, status: str | None = None) -> dict[str, Any]:
        result = self._result
        incomplete = result is not None and result.finish_reason == "length"
        if status is None:
            status = "incomplete" if incomplete else "completed"
        out = {
            "id": self.id, "object": "response", "created_at": self._created, "status": status,
            "model": self._model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": [] if result is None else [self._message(status)],
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
            "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "usage": None, **self._echo,
        }
        if status in ("completed", "incomplete"):
            out["completed_at"] = int(time.time())
        if result is not None:
            u = result.usage
            out["usage"] = {"input_tokens": u.prompt_tokens,
                            "input_tokens_details": {"cached_tokens": u.cached_tokens},
                            "output_tokens": u.completion_tokens,
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": u.total_tokens}
        return out

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return generation.sse({"type": kind, "sequence_number": self._seq - 1, **fields}, kind)

    @property
    def finished(self) -> bool:
        return self._result is not None

    def add(self, index: int, delta: Delta) -> None:
        self._text.append(delta.text)
        if delta.result is not None:
            self._result = delta.result

    def response(self) -> dict[str, Any]:
        return self._response()

    def stream_start(self) -> list[bytes]:
        part = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress")),
                self._event("response.output_item.added", output_index=0,
                            item=self._message("in_progress")),
                self._event("response.content_part.added", **part,
                            part={"type": "output_text", "text": "", "annotations": []})]

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        part = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        out = []
        if delta.text:
            self._text.append(delta.text)
            out.append(self._event("response.output_text.delta", **part, delta=delta.text,
                                   logprobs=[]))
        if delta.result is not None:
            self._result = delta.result
            text = "".join(self._text)
            status = self._response()["status"]
            out += [self._event("response.output_text.done", **part, text=text, logprobs=[]),
                    self._event("response.content_part.done", **part,
                                part={"type": "output_text", "text": text, "annotations": []}),
                    self._event("response.output_item.done", output_index=0,
                                item=self._message(status)),
                    self._event(f"response.{status}", response=self._response())]
        return out

    def stream_end(self) -> list[bytes]:
        return []

    def stream_error(self, error: APIError) -> list[bytes]:
        return [self._event("error", code=error.code, message=error.message, param=error.param)]


def _response_format(body: Fields) -> dict[str, Any] | None:
    """`text.format` as chat's response_format: json_schema's name/schema/strict sit in the
    format itself here, under `json_schema` there (chat's checks then apply to them)."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    raise bad_request(f"'text.format' must be {{\"type\": \"text\" | \"json_object\" | "
                      f"\"json_schema\", ...}}, got {show(fmt)}", param="text.format",
                      code="invalid_value")


def _chat_body(body: Fields, messages: list[dict[str, Any]]) -> dict[str, Any]:
    max_output = body.integer("max_output_tokens", low=1)
    chat: dict[str, Any] = {"messages": messages, "stream": body.boolean("stream")}
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop",
                 "presence_penalty", "frequency_penalty"):
        if body.get(name) is not None:
            chat[name] = body.get(name)
    if max_output is not None:
        chat["max_tokens"] = max_output
    return chat


async def create(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    raw = await ctx.read_json(request)
    ctx.require_ready()
    body = Fields(raw)
    _check_unsupported(body)
    messages = input_messages(body.get("input"))
    instructions = body.string("instructions")
    previous = body.string("previous_response_id")
    history = ctx.responses.get(previous, 400, "previous_response_id")[0] if previous else []
    # Instructions apply to this response only: they are not carried to the next.
    system = [{"role": "system", "content": instructions}] if instructions else []
    store = body.boolean("store")
    parsed, prompt = await generation.prepare_chat(
        request, ctx, _chat_body(body, [*system, *history, *messages]))
    options = parsed.options
    params = options.choice_params(0)
    echo = {"instructions": instructions, "max_output_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p,
            "previous_response_id": previous, "store": store,
            "metadata": raw.get("metadata") or {}}
    shape = ResponsesShape(ctx.check_model(options.model), options, echo)
    answer = await generation.respond(request, ctx, shape, [prompt.tokens], [params],
                                      options.stream, arrival)
    if store:
        if options.stream:
            # Stored once the stream has run to its end.
            stream_body = answer.body_iterator  # type: ignore[attr-defined]

            async def then_store() -> Any:
                async for chunk in stream_body:
                    yield chunk
                if shape.finished:
                    ctx.responses.put(shape.response(), [*history, *messages])

            answer.body_iterator = then_store()  # type: ignore[attr-defined]
        elif answer.status_code == 200:
            ctx.responses.put(shape.response(), [*history, *messages])
    return answer


async def retrieve(request: HTTPRequest, ctx: AppContext) -> Response:
    ctx.require_ready()
    return json_response(ctx.responses.get(request.path_params["response_id"], 404,
                                           "response_id")[1])
