"""Tool calls in a model's output: the formats models write them in, which one a model uses
(from its chat template and vocabulary), and one parser that turns the text, whole or as it
streams, into calls (name + arguments JSON text) and the content around them.

Formats (facts from the models' templates and llama.cpp's common/chat.cpp):
- hermes (Hermes 2/3, Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  one block per call, text may come before; Qwen3-Coder writes the body as XML (`<function=NAME>`
  with `<parameter=KEY>` values), read as the same calls;
- llama3 (Llama 3.1/3.2/3.3): the answer is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`; several calls separated by `;` or whitespace;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]` (Nemo, v0.3) or
  `[TOOL_CALLS]name[ARGS]{...}` / `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` (newer models);
- generic: the whole answer is JSON: `{"tool_calls": [call, ...]}`, `{"tool_call": call}`, a call,
  or an array of calls (what ember's standard tool prompt asks of templates without tools).
A call is `{"name": ..., "arguments" | "parameters": ...}`.

parse(text, final) is a pure function of the text so far, so a stream and a whole response give
the same calls: the stream re-parses and sends what grew. While not final it holds back what may
still become a call (a marker's first characters, an undecided JSON object), so call text never
leaks as content. A call counts once its name and the start of its arguments are known; it then
stays a call even if the output ends inside it (as OpenAI reports a truncated call). Arguments
are the model's own JSON text, so streamed fragments add up to exactly the final arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolFormat:
    name: str                # "hermes", "llama3", "mistral" or "generic"
    markers: tuple[str, ...]  # texts that start calls: kept in the decoded output when they are
                              # control tokens (Llama's <|python_tag|>, Mistral's [TOOL_CALLS])


HERMES = ToolFormat("hermes", ("<tool_call>", "</tool_call>"))
LLAMA3 = ToolFormat("llama3", ("<|python_tag|>",))
MISTRAL = ToolFormat("mistral", ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
GENERIC = ToolFormat("generic", ())
FORMATS = {f.name: f for f in (HERMES, LLAMA3, MISTRAL, GENERIC)}


def detect_format(template_source: str, vocabulary_has: Callable[[str], bool]) -> ToolFormat:
    """The format a model with this template writes calls in. The template's own text decides
    first (as llama.cpp's chat-parser does: the literal markers it asks the model for), then the
    vocabulary's marker tokens, else generic JSON."""
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if "<tool_call>" in template_source:
        return HERMES
    if "<|start_header_id|>" in template_source and ("ipython" in template_source
                                                     or "<|python_tag|>" in template_source):
        return LLAMA3
    for fmt in (MISTRAL, HERMES, LLAMA3):
        if vocabulary_has(fmt.markers[0]):
            return fmt
    return GENERIC


@dataclass
class ParsedCall:
    name: str
    arguments: str          # JSON text; a prefix of it while the call is still being written
    complete: bool = True   # its arguments are whole


@dataclass
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


# --- JSON scanning -----------------------------------------------------------------------------

_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*(")?|[{}\[\]]')
_SCALAR = re.compile(r'-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                        r'\s*:\s*(?=\{)')
_FIRST_KEY = re.compile(r'\{\s*"((?:[^"\\]|\\.)*)"')
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "function", "type", "tool_calls",
                        "tool_call", "id"})
_WS = re.compile(r"\s*")


def value_end(text: str, i: int) -> int | None:
    """The index just past the JSON value that starts at text[i], or None when the text ends
    before it does. Brackets are matched outside strings; validity is json.loads' job."""
    if i >= len(text):
        return None
    if text[i] not in '{["':
        m = _SCALAR.match(text, i)
        return m.end() if m and m.end() < len(text) else None
    depth = 0
    for m in _JSON_TOKENS.finditer(text, i):
        token = m.group()
        if token[0] == '"':
            if m.group(1) is None:
                return None  # an unterminated string
        elif token in "{[":
            depth += 1
        else:
            depth -= 1
        if depth <= 0:
            return m.end()
    return None


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return _INVALID


_INVALID = object()


def _call_from_value(value: object) -> ParsedCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict) and "name" not in value:
        value = value["function"]
    name = value.get("name")
    args = value.get("arguments", value.get("parameters"))
    if not isinstance(name, str) or not name or args is None and "arguments" not in value:
        return None
    if isinstance(args, str):
        return ParsedCall(name, args)
    return ParsedCall(name, json.dumps({} if args is None else args, ensure_ascii=False))


def _calls_from_value(value: object) -> list[ParsedCall] | None:
    """Calls of a whole JSON value in any of the generic shapes, or None."""
    if isinstance(value, dict):
        if isinstance(value.get("tool_calls"), list):
            value = value["tool_calls"]
        elif isinstance(value.get("tool_call"), dict):
            value = [value["tool_call"]]
        else:
            value = [value]
    if not isinstance(value, list) or not value:
        return None
    calls = [_call_from_value(v) for v in value]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _object_call(text: str, i: int) -> tuple[ParsedCall | None, int | None, bool]:
    """The call object at text[i] == '{': (call, end, decided). call is None when it is not a
    call or not known yet; end is None while the object is incomplete; decided is False while
    more text could still make it a call."""
    head = _CALL_HEAD.match(text, i)
    if head:
        name = _loads('"' + head.group(1) + '"')
        start = head.end()
        args_end = value_end(text, start)
        if isinstance(name, str):
            if args_end is None:
                return ParsedCall(name, text[start:], complete=False), None, True
            return ParsedCall(name, text[start:args_end]), value_end(text, i), True
    end = value_end(text, i)
    if end is None:
        first = _FIRST_KEY.match(text, i)
        if first and _loads('"' + first.group(1) + '"') not in _CALL_KEYS:
            return None, None, True  # {"answer": ...}: not a call, whatever follows
        return None, None, False
    calls = _calls_from_value(_loads(text[i:end]))
    return (calls[0] if calls and len(calls) == 1 else None), end, True


def _array_calls(text: str, i: int) -> tuple[list[ParsedCall] | None, int | None, bool]:
    """Calls in the JSON array at text[i] == '[': (calls, end, decided), as _object_call."""
    calls: list[ParsedCall] = []
    j = _WS.match(text, i + 1).end()
    while True:
        if j >= len(text):
            return (calls or None), None, bool(calls)
        if text[j] == "]" and not calls:
            return None, j + 1, True
        if text[j] != "{":
            return None, None, True
        call, end, decided = _object_call(text, j)
        if call is None:
            return (calls or None), None, decided or bool(calls)
        calls.append(call)
        if end is None:
            return calls, None, True
        j = _WS.match(text, end).end()
        if j >= len(text):
            return calls, None, True
        if text[j] == ",":
            j = _WS.match(text, j + 1).end()
            continue
        if text[j] == "]":
            return calls, j + 1, True
        return calls, None, True  # garbage after a call: the calls so far stand


# --- content around calls ----------------------------------------------------------------------

def _held_marker_prefix(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could be the start of a marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-n:]):
                best = n
                break
    return best


class _Builder:
    """Content segments and calls in order; whitespace next to a call is not content."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.calls: list[ParsedCall] = []

    def text(self, segment: str) -> None:
        if self.calls:
            segment = segment.lstrip()
        self.parts.append(segment)

    def call(self, call: ParsedCall) -> None:
        if self.parts:
            self.parts[-1] = self.parts[-1].rstrip()
        self.calls.append(call)

    def hold(self) -> None:
        """Not final: trailing whitespace may yet sit next to a call."""
        if self.parts:
            self.parts[-1] = self.parts[-1].rstrip()

    def output(self) -> ParsedOutput:
        return ParsedOutput("".join(self.parts), self.calls)


def _tail(out: _Builder, text: str, final: bool, markers: tuple[str, ...]) -> ParsedOutput:
    if final:
        out.text(text)
    else:
        out.text(text[:len(text) - _held_marker_prefix(text, markers)])
        out.hold()
    return out.output()


# --- the formats -------------------------------------------------------------------------------

def _parse_hermes(text: str, final: bool) -> ParsedOutput:
    out, pos, search = _Builder(), 0, 0
    while True:
        start = text.find("<tool_call>", search)
        if start < 0:
            return _tail(out, text[pos:], final, ("<tool_call>",))
        body = _WS.match(text, start + len("<tool_call>")).end()
        close = text.find("</tool_call>", body)
        limit = close if close >= 0 else len(text)
        if text[body:body + 1] == "{":
            call, _, decided = _object_call(text[:limit], body)
        elif text[body:body + 1] == "<":
            call, decided = _xml_call(text[:limit], body, complete=close >= 0 or final)
        else:
            call, decided = None, body < limit or final
        if call is None and (decided or final or close >= 0):
            search = start + 1  # not a call: its text is content
            continue
        if call is None:
            out.text(text[pos:start])
            out.hold()
            return out.output()
        out.text(text[pos:start])
        out.call(call)
        if close < 0:
            return out.output()
        pos = search = close + len("</tool_call>")


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _xml_call(text: str, i: int, complete: bool) -> tuple[ParsedCall | None, bool]:
    """Qwen3-Coder's XML call at text[i] (inside a <tool_call> block): `<function=NAME>` then
    `<parameter=KEY>\nVALUE\n</parameter>`s. Its arguments are rebuilt as a JSON object (a
    value that reads as JSON is that value, else a string), so they arrive whole, once the
    function closes or the text ends."""
    head = _XML_FUNCTION.match(text, i)
    if head is None:
        rest = text[i:]
        undecided = "<function=".startswith(rest) or re.fullmatch(r"<function=[^>\n]*", rest)
        return None, not undecided or complete
    close = text.find("</function>", head.end())
    if close < 0 and not complete:
        return ParsedCall(head.group(1).strip(), "", complete=False), True
    arguments = {}
    for m in _XML_PARAMETER.finditer(text, head.end(), close if close >= 0 else len(text)):
        value = _loads(m.group(2))
        arguments[m.group(1).strip()] = m.group(2) if value is _INVALID or isinstance(
            value, str) else value
    return ParsedCall(head.group(1).strip(), json.dumps(arguments, ensure_ascii=False),
                      complete=close >= 0), True


def _json_calls(text: str, i: int) -> tuple[list[ParsedCall] | None, int | None, bool]:
    """Calls of the JSON value at text[i]: an object (a call, or {"tool_calls": [...]} /
    {"tool_call": call}) or an array of calls."""
    if text[i] == "[":
        return _array_calls(text, i)
    wrapper = re.compile(r'\{\s*"tool_calls?"\s*:\s*').match(text, i)
    if wrapper:
        j = wrapper.end()
        if j >= len(text):
            return None, None, False
        if text[j] in "[{":
            calls, end, decided = (_array_calls if text[j] == "[" else _one_call)(text, j)
            if end is not None:
                close = _WS.match(text, end).end()
                end = close + 1 if text[close:close + 1] == "}" else None
            return calls, end, decided
        return None, value_end(text, i), True
    return _one_call(text, i)


def _one_call(text: str, i: int) -> tuple[list[ParsedCall] | None, int | None, bool]:
    call, end, decided = _object_call(text, i)
    return ([call] if call else None), end, decided


def _take_calls(out: _Builder, found: tuple[list[ParsedCall] | None, int | None, bool],
                final: bool) -> ParsedOutput | int | None:
    """Adds the calls of a JSON value (_json_calls / _array_calls: calls, end, decided) to
    `out`. Returns the index past the value, to read on from; or the output to return now (the
    value is still undecided, so held back, or a call is still being written); or None when the
    value is no call (the calls before it stand, and the rest is content)."""
    calls, end, decided = found
    if calls is None:
        if not decided and not final:
            out.hold()
            return out.output()
        return None
    for call in calls:
        out.call(call)
    return out.output() if end is None else end


_FENCE = re.compile(r"```(?:json)?[ \t]*\n\s*")
_FENCE_START = re.compile(r"`{1,3}(?:j(?:s(?:o(?:n)?)?)?)?[ \t]*")


def _parse_json_answer(text: str, final: bool, sep: str, start_markers: tuple[str, ...]
                       ) -> ParsedOutput:
    """llama3 and generic: calls are JSON values at the start of the answer (or after a start
    marker, or in a ```json fence), separated by `sep` characters."""
    out = _Builder()
    start, marker_len, fenced = 0, 0, False
    for marker in start_markers:
        k = text.find(marker)
        if k >= 0:
            start, marker_len = k, len(marker)
            break
    if not marker_len:
        lead = _WS.match(text).end()
        if lead == len(text):
            return _tail(out, text, final, start_markers)
        fence = _FENCE.match(text, lead)
        if fence is None and not final and _FENCE_START.fullmatch(text, lead):
            return ParsedOutput("")  # may open a fence
        if fence is not None:
            fenced, marker_len = True, fence.end() - lead
            if fence.end() == len(text) and not final:
                return ParsedOutput("")
        elif text[lead] not in "{[":
            return _tail(out, text, final, start_markers)
        start = lead
    out.text(text[:start])
    j = _WS.match(text, start + marker_len).end()
    while j < len(text) and text[j] in "{[":
        end = _take_calls(out, _json_calls(text, j), final)
        if isinstance(end, ParsedOutput):
            return end
        if end is None:
            break
        j = end
        while j < len(text) and (text[j].isspace() or text[j] in sep):
            j += 1
    if not out.calls:
        if fenced:  # a fence holding no call: content
            return ParsedOutput(text) if final or j < len(text) else ParsedOutput("")
        if marker_len:
            return ParsedOutput(text if final else text[:start])  # a lone marker: content
        return ParsedOutput(text) if final or j < len(text) else _tail(_Builder(), text, False, ())
    if fenced and text.startswith("```", j):
        j = _WS.match(text, j + 3).end()
    return _tail(out, text[j:], final, ("```",) if fenced else ())


_MISTRAL_NAME = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([^\[]*))?\[ARGS\]")


def _parse_mistral(text: str, final: bool) -> ParsedOutput:
    out = _Builder()
    marker = "[TOOL_CALLS]"
    start = text.find(marker)
    if start < 0:
        return _tail(out, text, final, (marker,))
    out.text(text[:start])
    j = start
    while text.startswith(marker, j):
        j = _WS.match(text, j + len(marker)).end()
        if text[j:j + 1] == "[":
            end = _take_calls(out, _array_calls(text, j), final)
            if isinstance(end, ParsedOutput):
                return end
            if end is None:
                break
            j = _WS.match(text, end).end()
            continue
        head = _MISTRAL_NAME.match(text, j)
        if head is None:
            if not final and re.fullmatch(r"\s*[A-Za-z0-9_.\-]*(\[[A-Z_]*\]?[^\[]*)*", text[j:]):
                out.hold()
                return out.output()
            break
        args = head.end()
        end = value_end(text, args)
        if end is None:
            out.call(ParsedCall(head.group(1), text[args:], complete=False))
            return out.output()
        out.call(ParsedCall(head.group(1), text[args:end]))
        j = end
    if not out.calls:
        return ParsedOutput(text) if final else _tail(_Builder(), text[:start], False, ())
    return _tail(out, text[j:], final, (marker,))


def parse(text: str, fmt: ToolFormat, final: bool = True) -> ParsedOutput:
    """The content and calls of `text` in format `fmt`; with final=False, of text that is
    still growing (see the module doc)."""
    if fmt.name == "hermes":
        return _parse_hermes(text, final)
    if fmt.name == "mistral":
        return _parse_mistral(text, final)
    if fmt.name == "llama3":
        return _parse_json_answer(text, final, ";", fmt.markers)
    return _parse_json_answer(text, final, "", ())


# --- streaming ---------------------------------------------------------------------------------

@dataclass
class CallDelta:
    index: int
    name: str | None   # set on a call's first delta
    arguments: str     # the next fragment of its arguments


class ToolCallStream:
    """Feeds a choice's text as it streams; returns the new content and call fragments."""

    def __init__(self, fmt: ToolFormat, prefix: str = "") -> None:
        self.fmt = fmt
        self.text = prefix  # the answer's opening, written in the prompt (a forced call's)
        self.sent = ParsedOutput("")

    def push(self, text: str, final: bool = False) -> tuple[str, list[CallDelta]]:
        self.text += text
        now = parse(self.text, self.fmt, final)
        content = ""
        if now.content.startswith(self.sent.content):
            content = now.content[len(self.sent.content):]
            self.sent.content = now.content
        deltas = []
        for i, call in enumerate(now.calls):
            if i >= len(self.sent.calls):
                self.sent.calls.append(ParsedCall(call.name, call.arguments, call.complete))
                deltas.append(CallDelta(i, call.name, call.arguments))
                continue
            old = self.sent.calls[i]
            if call.arguments.startswith(old.arguments) and len(call.arguments) > len(old.arguments):
                deltas.append(CallDelta(i, None, call.arguments[len(old.arguments):]))
                old.arguments = call.arguments
        return content, deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        return self.push("", final=True)
