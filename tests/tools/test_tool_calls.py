"""Tool calls in model output (ember.tools.calls): each format parsed on recorded outputs
(tests/data/tool_calls/outputs.json), the same calls and content when the text streams in any
pieces (and no call text leaking as content on the way), format detection from templates and
vocabularies, and the schema of a forced call."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ember.tools.calls import (
    FORMATS,
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    ToolCallStream,
    detect_format,
    parse,
    value_end,
)
from ember.tools.request import ToolRequest, ToolsError, call_constraint, parse_tools

DATA = Path(__file__).parent.parent / "data"
CASES = json.loads((DATA / "tool_calls" / "outputs.json").read_text())["cases"]
TEMPLATES = DATA / "chat_templates"


def _calls(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recorded_outputs_parse(case: dict[str, Any]) -> None:
    out = parse(case["output"], FORMATS[case["format"]])
    expected_calls = [tuple(c) for c in case["calls"]]
    assert _calls([(c.name, c.arguments) for c in out.calls]) == expected_calls
    assert all(c.complete for c in out.calls)
    if case["content"] is None:
        assert out.calls and out.content == ""
    else:
        assert out.content == case["content"]


def _stream(text: str, fmt_name: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]],
                                                               list[str]]:
    """Feeds `text` cut at `cuts`; (content, calls, every content piece) reassembled from the
    deltas as an OpenAI client does: a call's first delta names it, later ones add arguments."""
    stream = ToolCallStream(FORMATS[fmt_name])
    content, pieces, calls = "", [], {}
    bounds = [0, *cuts, len(text)]
    steps = [stream.push(text[a:b]) for a, b in zip(bounds, bounds[1:])] + [stream.finish()]
    for piece, deltas in steps:
        content += piece
        pieces.append(piece)
        for d in deltas:
            if d.name is not None:
                assert d.index == len(calls), "calls open in order"
                calls[d.index] = [d.name, d.arguments]
            else:
                calls[d.index][1] += d.arguments
    return content, [(n, a) for n, a in (calls[i] for i in sorted(calls))], pieces


def _cut_sets(text: str) -> list[list[int]]:
    rng = random.Random(len(text))
    every = list(range(1, len(text)))
    tokenish = sorted(rng.sample(every, min(len(every), len(text) // 3)))
    return [every, list(range(3, len(text), 3)), tokenish, []]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_streamed_pieces_reassemble_to_the_whole_parse(case: dict[str, Any]) -> None:
    text, fmt = case["output"], case["format"]
    whole = parse(text, FORMATS[fmt])
    for cuts in _cut_sets(text):
        content, calls, pieces = _stream(text, fmt, cuts)
        assert calls == [(c.name, c.arguments) for c in whole.calls]
        assert content == whole.content
        if whole.calls:  # nothing of a call's own text ever went out as content
            for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", '"name"'):
                assert all(marker not in p for p in pieces)


def test_arguments_stream_as_fragments_before_the_call_ends() -> None:
    text = ('<tool_call>\n{"name": "write", "arguments": {"text": "a long text to write"}}\n'
            "</tool_call>")
    stream = ToolCallStream(HERMES)
    fragments = []
    for i in range(len(text)):
        _, deltas = stream.push(text[i])
        fragments += [d.arguments for d in deltas if d.arguments]
    assert len(fragments) > 10  # one per character once the arguments began
    assert "".join(fragments) == '{"text": "a long text to write"}'


def test_a_call_cut_off_by_the_length_limit_stays_a_call() -> None:
    out = parse('<tool_call>\n{"name": "write", "arguments": {"text": "unfinis', HERMES)
    assert [(c.name, c.arguments, c.complete) for c in out.calls] == [
        ("write", '{"text": "unfinis', False)]
    # Not yet a call (no name): its text is content at the end, and held back until then.
    assert parse('<tool_call>\n{"na', HERMES).content == '<tool_call>\n{"na'
    assert parse('<tool_call>\n{"na', HERMES, final=False).content == ""
    assert parse("Hello <tool_c", HERMES, final=False).content == "Hello"
    assert parse("Hello <tool_c", HERMES).content == "Hello <tool_c"


def test_json_scanner_handles_strings_and_escapes() -> None:
    assert value_end('{"a": "}"} tail', 0) == 10
    assert value_end('{"a": "\\"}"}', 0) == 12
    assert value_end('{"a": "\\\\"}', 0) == 11
    assert value_end('{"a": "x\\', 0) is None
    assert value_end('[1, {"b": [2]}]', 0) == 15
    assert value_end('{"a": 1', 0) is None


@pytest.mark.parametrize("name, expected", [
    ("qwen2.5", HERMES), ("qwen3", HERMES), ("llama3.1", LLAMA3), ("llama3.2", LLAMA3),
    ("mistral-nemo", MISTRAL), ("smollm2", GENERIC), ("llama3", GENERIC)])
def test_format_detected_from_the_template(name: str, expected: Any) -> None:
    source = (TEMPLATES / f"{name}.jinja").read_text()
    assert detect_format(source, lambda marker: False) == expected


def test_format_detected_from_the_vocabulary_when_the_template_does_not_say() -> None:
    source = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}"
    assert detect_format(source, lambda m: m == "[TOOL_CALLS]") == MISTRAL
    assert detect_format(source, lambda m: m == "<|python_tag|>") == LLAMA3
    assert detect_format(source, lambda m: m == "<tool_call>") == HERMES
    assert detect_format(source, lambda m: False) == GENERIC


# --- the request fields --------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_parse_tools_normalizes_and_checks() -> None:
    request = parse_tools([WEATHER, TIME])
    assert request is not None and request.choice == "auto" and request.parallel
    assert request.tools[1] == {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    none = parse_tools([WEATHER], "none", False)
    assert none is not None and not none.offered and not none.parallel
    required = parse_tools([WEATHER, TIME], "required")
    assert required is not None and required.forced and required.function is None
    named = parse_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named is not None and named.forced and named.function == "get_time"
    assert parse_tools(None) is None and parse_tools([]) is None


@pytest.mark.parametrize("tools, choice, param, message", [
    ("x", None, "tools", "must be an array"),
    ([{"type": "retrieval"}], None, "tools[0]", "must be"),
    ([{"type": "function", "function": {"name": "bad name!"}}], None, "tools[0]", "letters"),
    ([WEATHER, WEATHER], None, "tools", "twice"),
    ([WEATHER], "sometimes", "tool_choice", "must be"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice",
     "not among"),
    (None, "required", "tool_choice", "needs 'tools'"),
])
def test_bad_tool_fields_name_the_field(tools: Any, choice: Any, param: str,
                                        message: str) -> None:
    with pytest.raises(ToolsError, match=message) as err:
        parse_tools(tools, choice)
    assert err.value.param == param


def test_call_constraint_in_each_format() -> None:
    tools = parse_tools([WEATHER, TIME]).tools  # type: ignore[union-attr]
    forced = ToolRequest(tools, "function", "get_weather", parallel=False)
    hermes = call_constraint(forced, HERMES)
    assert (hermes.prefix, hermes.suffix) == ("<tool_call>\n", "\n</tool_call>")
    assert hermes.schema == {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": WEATHER["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False}
    assert "parameters" in call_constraint(forced, LLAMA3).schema["properties"]
    any_call = ToolRequest(tools, "required")
    mistral = call_constraint(any_call, MISTRAL)
    assert mistral.prefix == "[TOOL_CALLS]" and mistral.schema["type"] == "array"
    assert len(mistral.schema["items"]["anyOf"]) == 2 and "maxItems" not in mistral.schema
    generic = call_constraint(forced, GENERIC).schema["properties"]["tool_calls"]
    assert generic["maxItems"] == 1
    # What the constraint allows parses back as that call.
    text = hermes.prefix + json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}) \
        + hermes.suffix
    assert [(c.name, json.loads(c.arguments)) for c in parse(text, HERMES).calls] == [
        ("get_weather", {"city": "Oslo"})]


# --- the OpenAI shapes (ember.openai_format.Formatter) ---------------------------------------------

def _deltas(text: str, finish: str) -> list[Any]:
    from ember.results import Delta, GenerationResult, Timings, Usage

    result = GenerationResult(text, [], finish, Usage(3, len(text), 3 + len(text)),
                              Timings(0.0, 0.0, 0.0, 0.0))
    return [Delta(c, [], [], finish if i == len(text) - 1 else None,
                  result if i == len(text) - 1 else None) for i, c in enumerate(text)]


@pytest.mark.parametrize("case", [c for c in CASES if c["calls"]][:8], ids=lambda c: c["name"])
def test_formatter_streams_what_it_answers(case: dict[str, Any]) -> None:
    from ember.openai_format import Formatter

    fmt_name, text = case["format"], case["output"]
    whole = Formatter(chat=True, model="m", n_choices=1, logprobs=False,
                      tool_format=FORMATS[fmt_name])
    for delta in _deltas(text, "stop"):
        whole.add(0, delta)
    [choice] = whole.response()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == case["content"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]] == [tuple(c) for c in case["calls"]]
    assert all(c["type"] == "function" and c["id"] for c in message["tool_calls"])

    stream = Formatter(chat=True, model="m", n_choices=1, logprobs=False,
                       tool_format=FORMATS[fmt_name])
    chunks = [c for d in _deltas(text, "stop") for c in stream.chunks(0, d)]
    content, calls = "", []
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        for part in delta.get("tool_calls", []):
            if "id" in part:
                calls.append([part["function"]["name"], part["function"]["arguments"]])
            else:
                calls[part["index"]][1] += part["function"]["arguments"]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "tool_calls"}
    assert content == (message["content"] or "")
    assert calls == [[c["function"]["name"], c["function"]["arguments"]]
                     for c in message["tool_calls"]]
    if fmt_name == "mistral":  # ids Mistral's templates accept back
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in message["tool_calls"])


def test_a_call_cut_by_max_tokens_keeps_finish_reason_length() -> None:
    from ember.openai_format import Formatter

    fmt = Formatter(chat=True, model="m", n_choices=1, logprobs=False, tool_format=HERMES)
    for delta in _deltas('<tool_call>\n{"name": "f", "arguments": {"a": "b', "length"):
        fmt.add(0, delta)
    [choice] = fmt.response()["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f",
                                                              "arguments": '{"a": "b'}
