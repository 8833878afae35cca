"""gpt-oss's harmony output format: an answer is a run of messages, each
`<|start|>assistant` (left out for the first, which the prompt opened) then a header
`<|channel|>NAME` with, for a tool call, ` to=functions.TOOL` and `<|constrain|>json`, then
`<|message|>BODY` ended by `<|end|>`, `<|call|>` (a tool call) or `<|return|>` (the final answer,
the text's end too).

The `analysis` channel is the model's reasoning (reasoning_content), `final` the answer
(content), `commentary` addressed to=functions.NAME a tool call whose body is the JSON arguments
(commentary without a recipient is a preamble shown to the user: content). This follows
OpenAI's harmony spec and llama.cpp's common/chat parser for gpt-oss.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ember.tools.calls import ParsedCall

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
EFFORTS = ("low", "medium", "high")  # the template's reasoning_effort ("Reasoning: medium")

_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*(\w+)")


@dataclass
class HarmonyOutput:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def _marker_prefix(text: str) -> int:
    """How many trailing characters of `text` could begin an end marker."""
    for k in range(min(len(text), max(map(len, ENDS)) - 1), 0, -1):
        if any(e.startswith(text[-k:]) for e in ENDS):
            return k
    return 0


def _header_parts(header: str) -> tuple[str, str | None]:
    """(channel, tool name or None) of a message header such as
    `assistant<|channel|>commentary to=functions.get_weather <|constrain|>json`."""
    channel = _CHANNEL_NAME.search(header)
    recipient = _RECIPIENT.search(header)
    return (channel.group(1) if channel else ""), (recipient.group(1) if recipient else None)


def parse(text: str, final: bool = True) -> HarmonyOutput:
    """The reasoning, content and tool calls of an answer's text. With final False the text is
    a prefix of the answer (streaming): a message still being written counts with what it has,
    a call's arguments then marked incomplete."""
    out = HarmonyOutput()
    reasoning, content = [], []
    i = 0
    while i < len(text):
        if text.startswith(START, i):
            i += len(START)
        body_at = text.find(MESSAGE, i)
        if body_at < 0:  # a header still arriving, or text outside the format
            rest = text[i:]
            if final and CHANNEL not in rest and rest.strip():
                content.append(rest)  # a model that wrote no harmony at all
            break
        channel, tool = _header_parts(text[i:body_at])
        body_start = body_at + len(MESSAGE)
        ends = [(text.find(e, body_start), e) for e in ENDS]
        ends = [(at, e) for at, e in ends if at >= 0]
        end_at, end = min(ends) if ends else (len(text), "")
        body = text[body_start:end_at]
        if not end and not final:
            body = body[:len(body) - _marker_prefix(body)]  # maybe an end marker, still arriving
        whole = bool(end) or final
        if tool is not None:
            out.calls.append(ParsedCall(tool, body.strip(), complete=whole))
        elif channel == "analysis":
            reasoning.append(body)
        elif body:  # final, or commentary addressed to the user (a preamble)
            content.append(body)
        i = end_at + len(end)
        if not end:
            break
    out.reasoning = "\n".join(r.strip() for r in reasoning if r.strip())
    out.content = "".join(content).strip()
    return out
