"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}), used by the OpenAI
Agents SDK and coding agents: `input` as a string or items (messages, `function_call`s and
their `function_call_output`s), `instructions`, `max_output_tokens`, `temperature`, `top_p`,
function `tools` (Responses' flat shape) with `tool_choice` and `parallel_tool_calls`, and
`stream` with the Responses event sequence (response.created ... response.completed, with
response.function_call_arguments.delta/.done for calls). Stateless unless `store: true` is
asked for; stored responses (response_store.py) can be continued with `previous_response_id`.
`text.format` (json_object, json_schema) is enforced by constrained decoding, as chat's
response_format. Hosted tools (web search, file search, ...) are a 400.

A request is translated to a chat-completions body and runs on the chat path
(prompts.chat_request: the tools go through the chat template, the answer is read for calls
by ember.tools.calls, as chat completions do; respond.respond); this module only translates
and shapes the answer.
"""

from __future__ import annotations

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
from ember.server.fields import Fields, show
from ember.server.prompts import ChatPrompt, chat_request
from ember.server.respond import Generation, respond, sse

_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "text"}


def _parts_text(value: Any, where: str) -> str:
    """A content given as a string or an array of text parts (joined with "\n")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise bad_request(f"'{where}[{j}]': only text parts (input_text, "
                                  f"output_text) are supported, got {show(kind)}",
                                  param=where, code="unsupported_content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_request(f"'{where}' must be a string or an array of text parts", param=where,
                      code="invalid_type")


def _content(value: Any, where: str, role: str) -> str | list[Any]:
    """A message's content: its text, or with input_image parts (a user's) chat content parts,
    each image an ImageRef of its image_url (a URL or data URL; a file_id is a 400: ember keeps
    no files)."""
    if not isinstance(value, list) or not any(
            isinstance(p, Mapping) and p.get("type") == "input_image" for p in value):
        return _parts_text(value, where)
    parts: list[Any] = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not (isinstance(part, Mapping) and part.get("type") == "input_image"):
            parts.append({"type": "text", "text": _parts_text([part], where)})
            continue
        if role != "user":
            raise bad_request(f"'{at}': images go in user messages, not in {role} ones",
                              param=at, code="unsupported_content")
        if part.get("file_id") is not None:
            raise bad_request(f"'{at}.file_id': images by file id are not supported (ember "
                              "keeps no files); send image_url, a URL or data URL",
                              param=f"{at}.file_id", code="unsupported_parameter")
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise bad_request(f"'{at}.image_url' must be a URL or data URL string", param=
                              f"{at}.image_url", code="invalid_value")
        detail = part.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise bad_request(f"'{at}.detail' must be 'auto', 'low' or 'high', got "
                              f"{show(detail)}", param=f"{at}.detail", code="invalid_value")
        parts.append(ImageRef(url, at))
    return parts


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; items are messages
    ({"role", "content"}, with or without "type": "message"), `function_call`s (calls the
    model made: an assistant message's tool_calls, joined to the assistant message or calls
    just before) and `function_call_output`s (a call's result: a "tool" message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of items",
                          param="input", code="invalid_type")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"'{where}' must be an object", param=where, code="invalid_type")
        fields = Fields(item, where)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": fields.required_string("call_id"), "type": "function",
                    "function": {"name": fields.required_string("name"),
                                 "arguments": fields.required_string("arguments")}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":
            continue  # earlier thinking: reasoning templates leave it out of the history
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": fields.required_string("call_id"),
                        "content": _parts_text(item.get("output"), f"{where}.output")})
        elif kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"'{where}.role' must be one of {sorted(_ROLES)}, got "
                                  f"{show(role)}", param=f"{where}.role", code="invalid_value")
            out.append({"role": role,
                        "content": _content(item.get("content"), f"{where}.content", role)})
        else:
            raise bad_request(f"'{where}': items of type {show(kind)} are not supported by "
                              "this server (message, function_call and function_call_output "
                              "are)", param=where, code="unsupported_parameter")
    return out


def _reasoning_effort(body: Fields) -> str | None:
    """`reasoning`: {"effort": ...} as chat's reasoning_effort ("none" turns thinking off);
    its `summary` ("auto" and the like) asks for a summary ember does not write: the
    reasoning item carries the thinking itself, its summary empty."""
    reasoning = body.get("reasoning")
    if reasoning is None:
        return None
    if not isinstance(reasoning, Mapping):
        raise bad_request("'reasoning' must be an object like {\"effort\": \"low\"}",
                          param="reasoning", code="invalid_type")
    effort = Fields(reasoning, "reasoning").string("effort")
    Fields(reasoning, "reasoning").string("summary")
    return effort


def _tools(body: Fields) -> list[dict[str, Any]] | None:
    """Responses' function tools ({"type": "function", "name", "description"?, "parameters"?,
    "strict"?}) in chat's shape; ember.tools.request checks them further. Hosted tools are a 400."""
    value = body.array("tools", "an array of {\"type\": \"function\", \"name\", ...}")
    if value is None:
        return None
    out = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind != "function":
            raise bad_request(f"'tools[{i}]': only function tools ({{\"type\": \"function\", "
                              f"\"name\", \"parameters\"}}) are supported, not hosted tools; "
                              f"got type {show(kind)}", param=f"tools[{i}]",
                              code="unsupported_parameter")
        out.append({"type": "function", "function": {k: v for k, v in tool.items()
                                                     if k != "type"}})
    return out


def _tool_choice(value: Any) -> Any:
    """Responses' tool_choice in chat's shape: the strings pass; {"type": "function", "name"}
    names one function."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                      f"\"function\", \"name\": ...}}, got {show(value)}", param="tool_choice",
                      code="invalid_value")


def _item(part: Part, status: str) -> dict[str, Any]:
    """An output item: a message (a text part), a reasoning item (a reasoning part: the
    thinking as its content, no summary) or a function_call (a call part)."""
    if part.kind == "reasoning":
        return {"type": "reasoning", "id": part.id, "status": status, "summary": [],
                "content": [] if status == "in_progress" else [
                    {"type": "reasoning_text", "text": part.text}]}
    if part.kind == "call":
        return {"type": "function_call", "id": part.id, "call_id": part.call_id,
                "name": part.name, "arguments": part.text, "status": status}
    content = [] if status == "in_progress" else [
        {"type": "output_text", "text": part.text, "annotations": []}]
    return {"type": "message", "id": part.id, "status": status, "role": "assistant",
            "content": content}


class ResponsesShape(PartsShape):
    """The Response object and its stream events; its output items are the answer's parts
    (answer_parts.py): a message for text, a function_call per call."""

    def __init__(self, model: str, prompt: ChatPrompt, echo: dict[str, Any]) -> None:
        super().__init__(prompt)
        self.id = f"resp_{uuid.uuid4().hex}"
        self._model = model
        self._created = int(time.time())
        self._echo = echo  # the request's fields a Response repeats
        self._seq = 0

    def _status(self) -> str:
        result = self.result
        if result is None:
            return "in_progress"
        return "incomplete" if result.finish_reason == "length" else "completed"

    def _response(self, status: str | None = None) -> dict[str, Any]:
        result = self.result
        status = status or self._status()
        out = {
            "id": self.id, "object": "response", "created_at": self._created, "status": status,
            "model": self._model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "output": [] if status == "in_progress" else [
                _item(part, "completed") for part in self.parts],
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
                            "total_tokens": u.total_tokens, **dropped_fields(u)}
        return out

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse({"type": kind, "sequence_number": self._seq - 1, **fields}, kind)

    # --- PartsShape ------------------------------------------------------------------------

    def new_text(self) -> Part:
        return Part("text", f"msg_{uuid.uuid4().hex}")

    def new_reasoning(self) -> Part:
        return Part("reasoning", f"rs_{uuid.uuid4().hex}")

    def new_call(self, name: str) -> Part:
        return Part("call", f"fc_{uuid.uuid4().hex}", name=name, call_id=self.fresh_call_id())

    def opened(self, part: Part) -> list[bytes]:
        index = self.index(part)
        out = [self._event("response.output_item.added", output_index=index,
                           item=_item(part, "in_progress"))]
        if part.kind == "text":
            out.append(self._event("response.content_part.added", item_id=part.id,
                                   output_index=index, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def grew(self, part: Part, text: str) -> list[bytes]:
        where = {"item_id": part.id, "output_index": self.index(part)}
        if part.kind == "call":
            return [self._event("response.function_call_arguments.delta", **where, delta=text)]
        if part.kind == "reasoning":
            return [self._event("response.reasoning_text.delta", **where, content_index=0,
                                delta=text)]
        return [self._event("response.output_text.delta", **where, content_index=0,
                            delta=text, logprobs=[])]

    def closed(self, part: Part) -> list[bytes]:
        index = self.index(part)
        where = {"item_id": part.id, "output_index": index}
        if part.kind == "text":
            out = [self._event("response.output_text.done", **where, content_index=0,
                               text=part.text, logprobs=[]),
                   self._event("response.content_part.done", **where, content_index=0,
                               part={"type": "output_text", "text": part.text,
                                     "annotations": []})]
        elif part.kind == "reasoning":
            out = [self._event("response.reasoning_text.done", **where, content_index=0,
                               text=part.text)]
        else:
            out = [self._event("response.function_call_arguments.done", **where,
                               name=part.name, arguments=part.text)]
        return out + [self._event("response.output_item.done", output_index=index,
                                  item=_item(part, "completed"))]

    def ended(self) -> list[bytes]:
        return [self._event(f"response.{self._status()}", response=self._response())]

    # --- respond.Shape ---------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        return self._response()

    def stream_start(self) -> list[bytes]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

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
    chat: dict[str, Any] = {"messages": messages, "stream": body.boolean("stream"),
                            "tools": _tools(body),
                            "tool_choice": _tool_choice(body.get("tool_choice")),
                            "parallel_tool_calls": body.get("parallel_tool_calls")}
    response_format = _response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop",
                 "presence_penalty", "frequency_penalty", "reasoning_budget_tokens"):
        if body.get(name) is not None:
            chat[name] = body.get(name)
    if max_output is not None:
        chat["max_tokens"] = max_output
    effort = _reasoning_effort(body)
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def _truncation(body: Fields) -> str | None:
    """OpenAI's `truncation`: "auto" drops the conversation's oldest items to fit the context
    (the shift policy), "disabled" refuses a conversation too long (error); absent, the
    server's --context-overflow."""
    value = body.string("truncation")
    if value is None:
        return None
    if value not in ("auto", "disabled"):
        raise bad_request(f"'truncation' must be \"auto\" or \"disabled\", got {show(value)}",
                          param="truncation", code="invalid_value")
    return "shift" if value == "auto" else "error"


async def create(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    raw = await ctx.read_json(request)
    ctx.require_ready()
    body = Fields(raw)
    messages = input_messages(body.get("input"))
    instructions = body.string("instructions")
    previous = body.string("previous_response_id")
    history = ctx.responses.get(previous, 400, "previous_response_id")[0] if previous else []
    # Instructions apply to this response only: they are not carried to the next.
    system = [{"role": "system", "content": instructions}] if instructions else []
    store = body.boolean("store")
    overflow = _truncation(body)
    parsed, prompt = await chat_request(request, ctx,
                                        _chat_body(body, [*system, *history, *messages]),
                                        overflow=overflow)
    options = parsed.options
    params = options.choice_params(0)
    echo = {"instructions": instructions, "max_output_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p,
            "previous_response_id": previous, "store": store,
            "metadata": raw.get("metadata") or {},
            "tools": raw.get("tools") or [], "tool_choice": raw.get("tool_choice") or "auto",
            "parallel_tool_calls": parsed.tools.parallel if parsed.tools else True,
            "truncation": "disabled" if (overflow or ctx.config.context_overflow) == "error"
            else "auto"}
    shape = ResponsesShape(ctx.model_name, prompt, echo)
    answer = await respond(request, ctx, shape,
                           Generation([prompt.tokens], [params], options.stream,
                                      prompt.keep_tokens, [prompt.dropped], prompt.images),
                           arrival)

    def store_it() -> None:
        response = shape.response()
        ctx.responses.put(response, [*history, *messages, *input_messages(response["output"])])

    if store:
        if options.stream:
            # Stored once the stream has run to its end.
            stream_body = answer.body_iterator  # type: ignore[attr-defined]

            async def then_store() -> Any:
                async for chunk in stream_body:
                    yield chunk
                if shape.finished:
                    store_it()

            answer.body_iterator = then_store()  # type: ignore[attr-defined]
        elif answer.status_code == 200:
            store_it()
    return answer


async def retrieve(request: HTTPRequest, ctx: AppContext) -> Response:
    ctx.require_ready()
    return json_response(ctx.responses.get(request.path_params["response_id"], 404,
                                           "response_id")[1])
