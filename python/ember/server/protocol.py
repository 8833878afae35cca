"""Request bodies of /v1/chat/completions and /v1/completions, validated into dataclasses.

Every check names the field (`param`) and says what was expected and what came. Unknown fields
are ignored (clients send `user`, `metadata`, `store`, ...), but a known option that ember cannot
honour yet (response_format json_object/json_schema, tools, echo, suffix, best_of > 1) is an
error, never silently dropped. Omitted sampling fields take SamplingParams' (llama.cpp's)
defaults; max_tokens defaults to 16 for completions (as OpenAI) and to "until the model stops
or the context is full" for chat.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union

from ember.sampling import MAX_TOP_LOGPROBS, SamplingParams
from ember.server.errors import APIError, bad_request

Prompt = Union[str, list[int]]

MAX_STOP_STRINGS = 16
MAX_PROMPTS = 64
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# What the C++ engine's types hold (sampling/params.h: int32 top_k, float temperature, ...).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 80, 80, 3


def show(value: Any) -> str:
    """A short repr for error messages: bounded in length and depth, whatever the client sent."""
    return _REPR.repr(value)


def check_text(text: str, param: str) -> None:
    """A 400 naming `param` when `text` cannot be UTF-8 (a lone surrogate, which JSON's \\udXXX
    escapes can spell but no tokenizer can read)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_request(f"'{param}' is not valid text: it holds a lone surrogate "
                          f"({show(err.object[err.start:err.end])} at character {err.start}), "
                          "which UTF-8 cannot encode", param=param, code="invalid_value") from None


@dataclass
class Options:
    """What both endpoints share."""

    model: str | None
    stream: bool
    include_usage: bool
    n: int
    params: SamplingParams           # seed as asked; choice i of a seeded request uses seed + i
    logprobs: bool
    top_logprobs: int

    def choice_params(self, index: int) -> SamplingParams:
        if self.params.seed is None or index == 0:
            return self.params
        return replace(self.params, seed=(self.params.seed + index) % 2**64)


@dataclass
class ChatCompletionRequest:
    options: Options
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CompletionRequest:
    options: Options
    prompts: list[Prompt] = field(default_factory=list)


def _type_name(value: Any) -> str:
    return "null" if value is None else {bool: "boolean", int: "integer", float: "number",
                                         str: "string", list: "array",
                                         dict: "object"}.get(type(value), type(value).__name__)


class Fields:
    """Typed reads of a JSON object's fields; wrong types raise a 400 naming the field."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body

    def get(self, name: str) -> Any:
        return self.body.get(name)

    def _fail(self, name: str, expected: str) -> APIError:
        got = self.body.get(name)
        return bad_request(f"'{name}' must be {expected}, got {_type_name(got)} {show(got)}",
                           param=name, code="invalid_type")

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(name, "a boolean")
        return value

    def string(self, name: str) -> str | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def integer(self, name: str, low: int | None = None, high: int | None = None) -> int | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, "an integer")
        _check_range(name, value, low, high)
        return value

    def number(self, name: str, low: float | None = None,
               high: float | None = None) -> float | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, "a number")
        _check_range(name, value, low, high)
        # The engine stores these as float32: 1e400 (inf in Python's JSON) or 10**40 cannot be.
        if isinstance(value, int) and abs(value) > FLOAT32_MAX or (
                isinstance(value, float) and not abs(value) <= FLOAT32_MAX):
            raise bad_request(f"'{name}' must be a finite number of at most {FLOAT32_MAX:.4g} in "
                              f"magnitude, got {show(value)}", param=name, code="invalid_value")
        return float(value)


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"between {low} and {high}" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}")
        raise bad_request(f"'{name}' must be {bounds}, got {show(value)}", param=name,
                          code="invalid_value")


def _unsupported(name: str, what: str) -> APIError:
    return bad_request(f"'{name}': {what} is not supported by this server yet", param=name,
                       code="unsupported_parameter")


def _check_unsupported(body: Fields) -> None:
    response_format = body.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, Mapping) else None
        if kind in ("json_object", "json_schema"):
            raise _unsupported("response_format", f"type '{kind}' (it needs grammar-constrained "
                               "sampling, which ember's server does not have yet); omit it or "
                               "use {\"type\": \"text\"}")
        if kind != "text":
            raise bad_request("'response_format' must be {\"type\": \"text\" | \"json_object\" | "
                              f"\"json_schema\", ...}}, got {show(response_format)}",
                              param="response_format", code="invalid_value")
    if body.get("tools"):
        raise _unsupported("tools", "tool calling")
    if body.get("functions"):
        raise _unsupported("functions", "function calling")
    if body.get("echo"):
        raise _unsupported("echo", "echoing the prompt")
    if body.get("suffix"):
        raise _unsupported("suffix", "a suffix (fill-in-the-middle)")
    best_of = body.integer("best_of", low=1)
    if best_of is not None and best_of > 1:
        raise _unsupported("best_of", "best_of > 1")


def _stop(body: Fields) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request(f"'stop' must be a string or an array of strings, got {show(stop)}",
                          param="stop", code="invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are "
                          "allowed", param="stop", code="invalid_value")
    for s in stop:
        check_text(s, "stop")
    return stop


def _logit_bias(body: Fields, n_vocab: int) -> dict[int, float]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, Mapping):
        raise bad_request(f"'logit_bias' must be an object mapping token ids to numbers, got "
                          f"{_type_name(bias)}", param="logit_bias", code="invalid_type")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_request(f"'logit_bias' keys must be token ids, got {show(key)}",
                              param="logit_bias", code="invalid_value") from None
        if not 0 <= token < n_vocab:
            raise bad_request(f"'logit_bias' token id {token} is out of range [0, {n_vocab})",
                              param="logit_bias", code="invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_request(f"'logit_bias' values must be numbers, got {show(value)} for token "
                              f"{token}", param="logit_bias", code="invalid_type")
        if not -100 <= value <= 100:
            raise bad_request(f"'logit_bias' values must be between -100 and 100, got "
                              f"{show(value)} for token {token}", param="logit_bias",
                              code="invalid_value")
        out[token] = float(value)
    return out


def _max_tokens(body: Fields, name: str, n_ctx: int) -> int | None:
    """At least 1 and at most the context (OpenAI and vLLM answer 400 beyond it too: prompt and
    completion share the context, so more can never be generated)."""
    value = body.integer(name, low=1)
    if value is not None and value > n_ctx:
        raise bad_request(f"'{name}' is {value}, more than the model's context of {n_ctx} tokens "
                          "(which prompt and completion share); ask for at most "
                          f"{n_ctx}", param=name, code="invalid_value")
    return value


def _options(body: Fields, *, chat: bool, n_vocab: int, n_ctx: int, max_n: int) -> Options:
    _check_unsupported(body)
    model = body.string("model")
    if model is not None:
        check_text(model, "model")
    stream = body.boolean("stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}",
                          param="stream_options", code="invalid_type")
    include_usage = Fields(stream_options or {}).boolean("include_usage")
    n = body.integer("n", low=1)
    if n is not None and n > max_n:
        raise bad_request(f"'n' is {n}; this server generates at most {max_n} choices per "
                          "request", param="n", code="invalid_value")

    if chat:
        logprobs = body.boolean("logprobs")
        top_logprobs = body.integer("top_logprobs", low=0, high=MAX_TOP_LOGPROBS) or 0
        if top_logprobs and not logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                              code="invalid_value")
        max_tokens = _max_tokens(body, "max_completion_tokens", n_ctx)
        if max_tokens is None:
            max_tokens = _max_tokens(body, "max_tokens", n_ctx)
    else:
        n_logprobs = body.integer("logprobs", low=0, high=MAX_TOP_LOGPROBS)
        logprobs, top_logprobs = n_logprobs is not None, n_logprobs or 0
        max_tokens = _max_tokens(body, "max_tokens", n_ctx)
        if "max_tokens" not in body.body:
            max_tokens = min(16, n_ctx)  # OpenAI's default for completions; an explicit null means "no limit"

    sampling: dict[str, Any] = {
        "temperature": body.number("temperature", low=0),
        "top_p": body.number("top_p", low=0, high=1),
        "top_k": body.integer("top_k", low=INT32_MIN, high=INT32_MAX),
        "min_p": body.number("min_p", low=0, high=1),
        "typical_p": body.number("typical_p", low=0, high=1),
        "repeat_penalty": body.number("repetition_penalty", low=0),
        "presence_penalty": body.number("presence_penalty", low=-2, high=2),
        "frequency_penalty": body.number("frequency_penalty", low=-2, high=2),
        "seed": body.integer("seed", low=0, high=2**64 - 1),
    }
    try:
        params = SamplingParams(
            **{k: v for k, v in sampling.items() if v is not None},
            logit_bias=_logit_bias(body, n_vocab), max_tokens=max_tokens, stop=_stop(body),
            logprobs=logprobs, top_logprobs=top_logprobs,
            prediction=_prediction(body) if chat else None)
        params.check(n_vocab)  # the C++ range checks, before anything is queued
    except ValueError as err:
        raise bad_request(f"invalid sampling parameters: {err}", code="invalid_value") from None
    return Options(model=model, stream=stream, include_usage=include_usage, n=n or 1,
                   params=params, logprobs=logprobs, top_logprobs=top_logprobs)


def _prediction(body: Fields) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or [text parts]}."""
    prediction = body.get("prediction")
    if prediction is None:
        return None
    wanted = '{"type": "content", "content": "..."}'
    if not isinstance(prediction, Mapping) or prediction.get("type") != "content":
        raise bad_request(f"'prediction' must be an object like {wanted}, got {show(prediction)}",
                          param="prediction", code="invalid_value")
    content = prediction.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, Mapping) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise bad_request("'prediction.content' parts must be {\"type\": \"text\", "
                              "\"text\": ...}", param="prediction.content", code="invalid_value")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad_request(f"'prediction.content' must be a string or an array of text parts, got "
                          f"{_type_name(content)}", param="prediction.content",
                          code="invalid_type")
    check_text(content, "prediction.content")
    return content


def _messages(body: Fields) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", param="messages", code="missing_required")
    if not isinstance(messages, list):
        raise bad_request(f"'messages' must be an array, got {_type_name(messages)}",
                          param="messages", code="invalid_type")
    if not messages:
        raise bad_request("'messages' is empty; send at least one message", param="messages",
                          code="invalid_value")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"'{param}' must be an object, got {_type_name(message)}",
                              param=param, code="invalid_type")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"'{param}.role' must be one of {sorted(CHAT_ROLES)}, got "
                              f"{show(role)}", param=f"{param}.role", code="invalid_value")
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(
                        f"'{param}.content[{j}]': only text parts "
                        f"({{\"type\": \"text\", \"text\": ...}}) are supported, got "
                        f"{show(kind or _type_name(part))}", param=f"{param}.content",
                        code="unsupported_content")
        elif not (isinstance(content, str) or (content is None and role == "assistant")):
            raise bad_request(f"'{param}.content' must be a string or an array of text parts, "
                              f"got {_type_name(content)}", param=f"{param}.content",
                              code="invalid_type")
        _check_strings(message, param)
        copy = dict(message)
        if content is None:
            copy["content"] = ""
        if role == "developer":  # OpenAI's newer name for the system role
            copy["role"] = "system"
        out.append(copy)
    return out


def _check_strings(value: Any, param: str) -> None:
    """check_text on every string in a message (the template may render any of its fields),
    iteratively, so a deeply nested value cannot exhaust the stack."""
    stack: list[tuple[Any, str]] = [(value, param)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, Mapping):
            for key, child in item.items():
                check_text(key, where)
                stack.append((child, f"{where}.{key}" if len(where) < 80 else where))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]" if len(where) < 80 else where)
                         for i, child in enumerate(item))


def _prompts(body: Fields, n_vocab: int) -> list[Prompt]:
    prompt = body.get("prompt")
    expected = "a string, an array of strings, an array of token ids or an array of those"
    if prompt is None:
        raise bad_request("'prompt' is required", param="prompt", code="missing_required")
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request(f"'prompt' must be {expected} (non-empty)", param="prompt",
                          code="invalid_type")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts: list[Any] = [prompt]
    else:
        prompts = prompt
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' has {len(prompts)} prompts; at most {MAX_PROMPTS} are "
                          "allowed per request", param="prompt", code="invalid_value")
    out: list[Prompt] = []
    for item in prompts:
        if isinstance(item, str):
            check_text(item, "prompt")
            out.append(item)
        elif (isinstance(item, list) and item
              and all(isinstance(t, int) and not isinstance(t, bool) for t in item)):
            bad = next((t for t in item if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise bad_request(f"'prompt' token id {bad} is out of range [0, {n_vocab})",
                                  param="prompt", code="invalid_value")
            out.append(list(item))
        else:
            raise bad_request(f"'prompt' must be {expected}", param="prompt",
                              code="invalid_type")
    return out


def parse_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checked `messages` of a body (developer roles as system, null contents as "")."""
    return _messages(Fields(body))


def parse_chat_request(body: Mapping[str, Any], *, n_vocab: int, n_ctx: int,
                       max_n: int) -> ChatCompletionRequest:
    fields = Fields(body)
    messages = _messages(fields)
    options = _options(fields, chat=True, n_vocab=n_vocab, n_ctx=n_ctx, max_n=max_n)
    return ChatCompletionRequest(options, messages)


def parse_completion_request(body: Mapping[str, Any], *, n_vocab: int, n_ctx: int,
                             max_n: int) -> CompletionRequest:
    fields = Fields(body)
    prompts = _prompts(fields, n_vocab)
    options = _options(fields, chat=False, n_vocab=n_vocab, n_ctx=n_ctx, max_n=max_n)
    return CompletionRequest(options, prompts)
