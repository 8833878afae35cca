"""Request bodies of /v1/chat/completions and /v1/completions, validated into dataclasses.

Every check names the field (`param`) and says what was expected and what came. Unknown fields
are ignored (clients send `user`, `metadata`, `store`, ...), but a known option that ember cannot
honour is an error, never silently dropped (docs/server-fields.md lists every field); chat's
`tools` are checked by ember.tools.request. Omitted fields take the server's defaults (--n-predict,
--temp, ...), else SamplingParams' (llama.cpp's); max_tokens then defaults to 16 for completions
(as OpenAI) and to "until the model stops or the context is full" for chat.
The constraint fields (response_format, json_schema, grammar) are read by server/constraints.py;
every field through fields.py's reader.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ember.grammar import BOUNDS, JsonBounds
from ember.images import ImageError, ImageRef, image_part
from ember.sampling import MAX_TOP_LOGPROBS, SamplingParams
from ember.server.constraints import FIELDS as CONSTRAINT_FIELDS
from ember.server.constraints import parse_constraint
from ember.server.errors import APIError, bad_request
from ember.server.fields import (
    FLOAT32_MAX,
    INT32_MAX,
    INT32_MIN,
    Fields,
    check_off,
    check_text,
    sampler_overrides,
    show,
    type_name,
)
from ember.server.lora import LoraTable, choose_adapter
from ember.tools.request import ToolRequest, ToolsError, parse_tools

MAX_STOP_STRINGS = 16
_TOKEN_ID = re.compile(r"-?[0-9]+")  # an object key that names a token id (else: a text)
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


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
    return_tokens: bool = False      # llama-server's: generated token ids in the response
    # llama-server's: probabilities (not logprobs) after the sampler chain, as prob/top_probs
    post_sampling_probs: bool = False
    timings_per_token: bool = False  # llama-server's: `timings` in every streamed chunk
    return_progress: bool = False    # llama-server's: a `prompt_progress` chunk in streams
    # llama-server's: the prompt's first tokens a truncate-middle keeps (-1: as many as it can)
    n_keep: int | None = None

    def choice_params(self, index: int) -> SamplingParams:
        if self.params.seed is None or index == 0:
            return self.params
        return replace(self.params, seed=(self.params.seed + index) % 2**64)


@dataclass
class ChatCompletionRequest:
    options: Options
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The text the reply starts with (a trailing assistant message, continued), then the
    # messages before it are rendered with add_generation_prompt.
    prefill: str | None = None
    add_generation_prompt: bool = True
    # The reply's content starts with the prefill: llama-server's way, when the trailing
    # assistant message was continued implicitly; vLLM's continue_final_message: true answers
    # only the continuation, and so does ember then.
    prefill_in_reply: bool = False
    tools: ToolRequest | None = None


@dataclass
class CompletionRequest:
    options: Options
    prompts: list[list[str | int]] = field(default_factory=list)  # fields.token_prompts
    echo: bool = False              # the prompt comes back before the completion (and is scored)
    suffix: str | None = None       # fill in the middle between the prompt and this
    best_of: int = 1                # candidates per prompt (>= n); the n most likely are returned


def _unsupported(name: str, what: str) -> APIError:
    return bad_request(f"'{name}': {what} is not supported by this server yet", param=name,
                       code="unsupported_parameter")


# vLLM's fields that change the output and that ember lacks: field -> (the value that changes
# nothing, or None when only omitting it does; what ember lacks).
_VLLM_OFF: dict[str, tuple[Any, str]] = {
    "use_beam_search": (False, "beam search"),
    "include_stop_str_in_output": (False, "stop strings in the output"),
    "skip_special_tokens": (True, "special tokens in the text (control tokens are dropped)"),
    "return_tokens_as_token_ids": (False, "tokens as 'token_id:N' strings"),
    "allowed_token_ids": (None, "allowed_token_ids (a constraint or logit_bias does it)"),
    "bad_words": (None, "bad_words (logit_bias or a constraint does it)"),
    "prompt_logprobs": (None, "prompt logprobs on this endpoint (/v1/completions' echo with "
                        "logprobs scores the prompt)"),
    "truncate_prompt_tokens": (None, "prompt truncation"),
    "chat_template": (None, "a chat template per request (the server's --chat-template)"),
    "documents": (None, "documents for the chat template"),
    "priority": (0, "priority scheduling"),
}


def _check_vllm(body: Fields) -> None:
    for name, (off, what) in _VLLM_OFF.items():
        value = body.get(name)
        if value is None or (off is not None and value == off and type(value) is type(off)) \
                or value == []:
            continue
        hint = "omit the field" if off is None else f"omit it or send {json.dumps(off)}"
        raise bad_request(f"'{name}': {what} is not supported by ember; {hint}", param=name,
                          code="unsupported_parameter")


def _check_unsupported(body: Fields, chat: bool) -> None:
    _check_vllm(body)
    if body.get("tools") and not chat:
        raise _unsupported("tools", "tool calling on /v1/completions (use chat completions)")
    if body.get("functions"):
        raise _unsupported("functions", "function calling")


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


def _min_tokens(body: Fields, max_tokens: int | None) -> int:
    """vLLM's min_tokens: no end-of-generation or stop token before that many tokens."""
    value = body.integer("min_tokens", low=0, high=INT32_MAX) or 0
    if max_tokens is not None and value > max_tokens:
        raise bad_request(f"'min_tokens' ({value}) must be at most the token limit "
                          f"({max_tokens})", param="min_tokens", code="invalid_value")
    return value


def _stop_token_ids(body: Fields, n_vocab: int) -> list[int]:
    """vLLM's stop_token_ids: token ids that end the output, as EOS does."""
    ids = body.array("stop_token_ids", "an array of token ids") or []
    return [_token_id(token, n_vocab, "stop_token_ids",
                      f"'stop_token_ids' must be an array of token ids, got {show(token)}")
            for token in ids]


def _token_id(token: Any, n_vocab: int, param: str, type_message: str) -> int:
    """`token` when it is a token id of the vocabulary; else a 400 naming `param`
    (type_message when it is no integer)."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise bad_request(type_message, param=param, code="invalid_type")
    if not 0 <= token < n_vocab:
        raise bad_request(f"'{param}' token id {token} is out of range [0, {n_vocab})",
                          param=param, code="invalid_value")
    return token


def _bias_value(value: Any, where: str, array_form: bool) -> float:
    """A bias: a number (OpenAI's object form: within [-100, 100], as OpenAI checks it;
    llama-server's array form: any finite number, added as given), or false: the token is
    never sampled (-inf)."""
    if value is False:
        return float("-inf")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"'logit_bias' values must be numbers or false, got {show(value)} for "
                          f"{where}", param="logit_bias", code="invalid_type")
    low, high = (-FLOAT32_MAX, FLOAT32_MAX) if array_form else (-100, 100)
    if not low <= value <= high:
        raise bad_request(f"'logit_bias' values must be between {low:g} and {high:g}, got "
                          f"{show(value)} for {where}", param="logit_bias", code="invalid_value")
    return float(value)


def _bias_tokens(key: Any, n_vocab: int, defaults: Defaults) -> list[int]:
    """The tokens a logit_bias entry names: a token id (an integer, or an object key that
    spells one), or a text, whose every token gets the bias (llama-server's reading: tokenized
    without BOS, control-token texts as plain text)."""
    token: Any = key
    if isinstance(key, str) and _TOKEN_ID.fullmatch(key):
        if len(key) > 12:  # past any vocabulary (and int()'s digit limit)
            raise bad_request(f"'logit_bias' key {show(key)} is too long for a token id "
                              f"(token ids are in [0, {n_vocab}))", param="logit_bias",
                              code="invalid_value")
        token = int(key)
    elif isinstance(key, str):
        check_text(key, "logit_bias")
        if defaults.tokenize is None:
            raise bad_request("'logit_bias' texts need the model's tokenizer; give token ids",
                              param="logit_bias", code="invalid_value")
        return defaults.tokenize(key)
    return [_token_id(token, n_vocab, "logit_bias",
                      f"'logit_bias' entries name a token id or a text, got {show(key)}")]


def _logit_bias(body: Fields, n_vocab: int, defaults: Defaults) -> dict[int, float]:
    """logit_bias in every form OpenAI and llama-server accept: {"id" or "text": bias} and
    [[id or "text", bias], ...], a bias being a number or false (never that token). As in
    llama-server, entries naming the same token add up."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if isinstance(bias, Mapping):
        entries, array_form = list(bias.items()), False
    elif isinstance(bias, list):
        for pair in bias:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise bad_request(f"'logit_bias' pairs must be [token id or text, number or "
                                  f"false], got {show(pair)}", param="logit_bias",
                                  code="invalid_value")
        entries, array_form = [tuple(pair) for pair in bias], True
    else:
        raise bad_request(f"'logit_bias' must be an object mapping token ids (or texts) to "
                          "numbers, or an array of [token id or text, number or false] pairs, "
                          f"got {type_name(bias)}", param="logit_bias", code="invalid_type")
    out: dict[int, float] = {}
    for key, value in entries:
        tokens = _bias_tokens(key, n_vocab, defaults)
        delta = _bias_value(value, f"{show(key)}", array_form)
        for token in tokens:
            out[token] = out.get(token, 0.0) + delta
    return out


def _max_tokens(body: Fields, name: str, n_ctx: int, low: int = 1) -> int | None:
    """At least `low` and at most the context (OpenAI and vLLM answer 400 beyond it too: prompt
    and completion share the context, so more can never be generated)."""
    value = body.integer(name, low=low)
    if value is not None and value > n_ctx:
        raise bad_request(f"'{name}' is {value}, more than the model's context of {n_ctx} tokens "
                          "(which prompt and completion share); ask for at most "
                          f"{n_ctx}", param=name, code="invalid_value")
    return value


def _token_budget(body: Fields, *, chat: bool, n_ctx: int, defaults: Defaults,
                  native: bool) -> int | None:
    """max_completion_tokens, max_tokens or llama-server's n_predict (-1: no limit), else the
    server's --n-predict, else the API's default: 16 for OpenAI completions (an explicit null
    means no limit), no limit for chat and llama-server's /completion. 0 (not in chat) evaluates
    the prompt alone."""
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    for name in names:
        value = _max_tokens(body, name, n_ctx, low=1 if chat else 0)
        if value is not None:
            return value
    n_predict = body.integer("n_predict", low=-1)
    if n_predict is not None:
        return None if n_predict == -1 else _max_tokens(body, "n_predict", n_ctx, low=0)
    if defaults.n_predict is not None:
        return None if defaults.n_predict == -1 else min(defaults.n_predict, n_ctx)
    if chat or native or "max_tokens" in body.body:
        return None
    return min(16, n_ctx)


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it omits, and what bounds it: the server's --n-predict and
    sampling flags (SamplingParams fields), its slot count and its choices limit."""

    n_predict: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    n_slots: int = 1
    max_n: int = 16
    # How a logit_bias text becomes tokens (the model's tokenizer); None: texts are refused.
    tokenize: Callable[[str], list[int]] | None = None
    json_bounds: JsonBounds = BOUNDS  # JSON constraints' number and whitespace bounds (--json-*)
    lora: LoraTable = field(default_factory=LoraTable)  # the served LoRA adapters


def parse_options(body: Fields, *, chat: bool, n_vocab: int, n_ctx: int, defaults: Defaults,
                  native: bool = False) -> Options:
    """The options every generation endpoint shares: chat's (logprobs as a boolean) or
    completions' (logprobs as a count); `native` is llama-server's /completion (no limit by
    default)."""
    _check_unsupported(body, chat)
    if chat or native:
        for name in ("echo", "suffix", "best_of"):  # completions' fields, refused rather than lost
            if body.get(name) is not None:
                raise bad_request(f"'{name}' is a field of OpenAI's /v1/completions, not of this "
                                  "endpoint", param=name, code="unsupported_parameter")
    check_off(body.body)
    model = body.string("model")
    if model is not None:
        check_text(model, "model")
    stream = body.boolean("stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}",
                          param="stream_options", code="invalid_type")
    include_usage = Fields(stream_options or {}).boolean("include_usage")
    max_n = defaults.max_n
    name = "n" if body.get("n") is not None else "n_cmpl"
    n = body.integer(name, low=1)
    if n is not None and n > max_n:
        raise bad_request(f"'{name}' is {n}; this server generates at most {max_n} choices per "
                          "request", param=name, code="invalid_value")
    cache_prompt = body.boolean("cache_prompt", default=True)  # false: no prefix-cache hit
    # Checked, not used: the engine places requests itself (any slot's prefix cache serves).
    body.integer("id_slot", low=-1, high=defaults.n_slots - 1)

    n_probs = body.integer("n_probs", low=0, high=MAX_TOP_LOGPROBS)
    if chat:
        logprobs = body.boolean("logprobs")
        top_logprobs = body.integer("top_logprobs", low=0, high=MAX_TOP_LOGPROBS) or 0
        if top_logprobs and not logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                              code="invalid_value")
    else:
        n_logprobs = body.integer("logprobs", low=0, high=MAX_TOP_LOGPROBS)
        logprobs, top_logprobs = n_logprobs is not None, n_logprobs or 0
    if n_probs and body.get("logprobs") is None:
        logprobs, top_logprobs = True, n_probs
    max_tokens = _token_budget(body, chat=chat, n_ctx=n_ctx, defaults=defaults, native=native)

    repeat_name = "repetition_penalty" if body.get("repetition_penalty") is not None \
        else "repeat_penalty"
    seed = body.integer("seed", low=-1, high=2**64 - 1)
    sampling: dict[str, Any] = {
        "temperature": body.number("temperature", low=0),
        "top_p": body.number("top_p", low=0, high=1),
        "top_k": body.integer("top_k", low=INT32_MIN, high=INT32_MAX),
        "min_p": body.number("min_p", low=0, high=1),
        "typical_p": body.number("typical_p", low=0, high=1),
        "repeat_penalty": body.number(repeat_name, low=0),
        "repeat_last_n": body.integer("repeat_last_n", low=-1, high=INT32_MAX),
        "presence_penalty": body.number("presence_penalty", low=-2, high=2),
        "frequency_penalty": body.number("frequency_penalty", low=-2, high=2),
        "seed": None if seed == -1 else seed,
    }
    given = {k: v for k, v in sampling.items() if v is not None}
    if seed == -1:
        given["seed"] = None  # llama-server's "random", over a server-side --seed
    values = {**defaults.sampling, **given}
    if body.get("samplers") is not None:
        values.update(sampler_overrides(body.get("samplers")))
    bias = _logit_bias(body, n_vocab, defaults)
    lora, lora_scale = choose_adapter(body, model, defaults.lora)
    try:
        params = SamplingParams(
            **values, logit_bias=bias, max_tokens=max_tokens, stop=_stop(body),
            logprobs=logprobs, top_logprobs=top_logprobs,
            ignore_eos=body.boolean("ignore_eos"),
            constraint=parse_constraint(body.body, defaults.json_bounds),
            prediction=_prediction(body) if chat else None,
            min_tokens=_min_tokens(body, max_tokens),
            stop_token_ids=_stop_token_ids(body, n_vocab),
            post_sampling_probs=body.boolean("post_sampling_probs"), cache_prompt=cache_prompt,
            lora=lora, lora_scale=lora_scale)
        params.check(n_vocab)  # the C++ range checks, before anything is queued
    except ValueError as err:
        raise bad_request(f"invalid sampling parameters: {err}", code="invalid_value") from None
    return Options(model=model, stream=stream, include_usage=include_usage, n=n or 1,
                   params=params, logprobs=logprobs, top_logprobs=top_logprobs,
                   return_tokens=body.boolean("return_tokens"),
                   post_sampling_probs=params.post_sampling_probs,
                   timings_per_token=body.boolean("timings_per_token"),
                   return_progress=body.boolean("return_progress"),
                   n_keep=body.integer("n_keep", low=-1, high=INT32_MAX))


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
                          f"{type_name(content)}", param="prediction.content",
                          code="invalid_type")
    check_text(content, "prediction.content")
    return content


def _messages(body: Fields) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", param="messages", code="missing_required")
    if not isinstance(messages, list):
        raise bad_request(f"'messages' must be an array, got {type_name(messages)}",
                          param="messages", code="invalid_type")
    if not messages:
        raise bad_request("'messages' is empty; send at least one message", param="messages",
                          code="invalid_value")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"'{param}' must be an object, got {type_name(message)}",
                              param=param, code="invalid_type")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"'{param}.role' must be one of {sorted(CHAT_ROLES)}, got "
                              f"{show(role)}", param=f"{param}.role", code="invalid_value")
        content = message.get("content")
        if isinstance(content, list):
            content = _parts(content, param, role)
        elif not (isinstance(content, str) or (content is None and role == "assistant")):
            raise bad_request(f"'{param}.content' must be a string or an array of text parts, "
                              f"got {type_name(content)}", param=f"{param}.content",
                              code="invalid_type")
        _check_strings(message, param)
        copy = dict(message)
        if isinstance(content, list):
            copy["content"] = content
        if content is None:
            copy["content"] = ""
        if role == "developer":  # OpenAI's newer name for the system role
            copy["role"] = "system"
        out.append(copy)
    return out


def _parts(content: list[Any], param: str, role: str) -> list[Any]:
    """A message's content parts: text parts as they are, image_url parts (and the ImageRefs
    other APIs' images were translated to) as ImageRefs, in user messages only."""
    out = []
    for j, part in enumerate(content):
        at = f"{param}.content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(part, ImageRef) or kind == "image_url":
            if role != "user":
                raise bad_request(f"'{at}': images go in user messages, not in {role} ones",
                                  param=at, code="unsupported_content")
            out.append(part if isinstance(part, ImageRef) else _image_part(part, at))
        elif kind == "text" and isinstance(part.get("text"), str):
            out.append(part)
        else:
            raise bad_request(
                f"'{at}': only text parts ({{\"type\": \"text\", \"text\": ...}}) and "
                f"image_url parts are supported, got {show(kind or type_name(part))}",
                param=at, code="unsupported_content")
    return out


def _image_part(part: Mapping[str, Any], param: str) -> ImageRef:
    try:
        return image_part(part, param)
    except ImageError as err:
        raise bad_request(str(err), param=param, code=err.code) from None


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


def parse_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checked `messages` of a body (developer roles as system, null contents as "")."""
    return _messages(Fields(body))


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # an assistant's: text parts only (_parts)
        return "\n".join(part["text"] for part in content)
    return content or ""


def split_prefill(body: Fields, messages: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], str | None, bool]:
    """(messages to render, prefill, add_generation_prompt). A trailing assistant message is
    continued, as llama-server does: the reply starts with its text. vLLM's spellings choose
    explicitly: continue_final_message (it needs a trailing assistant message) and
    add_generation_prompt (false: render the messages as they are, no new turn opened); both
    true contradict each other."""
    continue_final = body.get("continue_final_message")
    add_prompt = body.get("add_generation_prompt")
    continue_final = body.boolean("continue_final_message") if continue_final is not None \
        else None
    add_prompt = body.boolean("add_generation_prompt") if add_prompt is not None else None
    if continue_final and add_prompt:
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be "
                          "true: the first continues the last assistant message, the second "
                          "opens a new turn", param="continue_final_message",
                          code="invalid_value")
    # A lone assistant message has no conversation to continue: it is rendered as it is.
    # Nor does one carrying tool calls (it is history, answered by tool results).
    can_continue = messages[-1]["role"] == "assistant" and len(messages) > 1 \
        and not messages[-1].get("tool_calls")
    if continue_final and not can_continue:
        raise bad_request("'continue_final_message' needs an assistant message last, after at "
                          "least one other message", param="continue_final_message",
                          code="invalid_value")
    if continue_final is None:
        continue_final = can_continue and add_prompt is None
    if continue_final:
        return messages[:-1], _content_text(messages[-1]["content"]), True
    return messages, None, add_prompt is not False


def parse_chat_request(body: Mapping[str, Any], n_vocab: int, n_ctx: int,
                       defaults: Defaults) -> ChatCompletionRequest:
    fields = Fields(body)
    messages = _messages(fields)
    rendered, prefill, add_prompt = split_prefill(fields, messages)
    options = parse_options(fields, chat=True, n_vocab=n_vocab, n_ctx=n_ctx, defaults=defaults)
    implicit = body.get("continue_final_message") is None
    try:
        tools = parse_tools(body.get("tools"), body.get("tool_choice"),
                            body.get("parallel_tool_calls"))
    except ToolsError as err:
        raise bad_request(str(err), param=err.param, code=err.code) from None
    if tools is not None and tools.forced:
        if options.params.constraint is not None:
            other = next(n for n in CONSTRAINT_FIELDS if body.get(n) is not None)
            raise bad_request(f"'tool_choice' forces a tool call, which constrains the whole "
                              f"output, as '{other}' does too; give one of them",
                              param="tool_choice", code="invalid_value")
        if prefill is not None:
            raise bad_request("'tool_choice' forces a tool call, which starts a new assistant "
                              "message; it cannot continue the trailing assistant message",
                              param="tool_choice", code="invalid_value")
    return ChatCompletionRequest(options, rendered, prefill, add_prompt,
                                 prefill_in_reply=prefill is not None and implicit, tools=tools)


def parse_completion_request(body: Mapping[str, Any], n_vocab: int, n_ctx: int,
                             defaults: Defaults) -> CompletionRequest:
    fields = Fields(body)
    prompts = fields.token_prompts("prompt", n_vocab=n_vocab)
    options = parse_options(fields, chat=False, n_vocab=n_vocab, n_ctx=n_ctx, defaults=defaults)
    best_of = fields.integer("best_of", low=1)
    if best_of is not None and best_of < options.n:
        raise bad_request(f"'best_of' ({best_of}) must be >= 'n' ({options.n})",
                          param="best_of", code="invalid_value")
    if best_of is not None and best_of > defaults.max_n:
        raise bad_request(f"'best_of' is {best_of}; this server generates at most "
                          f"{defaults.max_n} candidates per prompt", param="best_of",
                          code="invalid_value")
    if best_of is not None and best_of > options.n and options.stream:
        raise bad_request("'best_of' > 'n' cannot be streamed (the best candidates are known "
                          "only once all have finished)", param="best_of", code="invalid_value")
    suffix = fields.string("suffix")
    if suffix is not None:
        check_text(suffix, "suffix")
    return CompletionRequest(options, prompts, fields.boolean("echo"), suffix or None,
                             best_of or options.n)
