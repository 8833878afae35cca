"""Reasoning models (Qwen3, DeepSeek-R1 distills: anything writing <think>...</think> before its
answer): what a request asks about thinking, the constraint that bounds the thinking and applies
a structured output to the answer after it, and the splitter that reads the thinking out of the
answer as it streams.

A model is a reasoning model when its chat template speaks of </think> (llama-server's "auto"
detection). Thinking is on unless the request turns it off: vLLM's
chat_template_kwargs {"enable_thinking": false} (Qwen3's template then renders an empty think
block), or reasoning_effort "none" (llama-server's). reasoning_format (the server's
--reasoning-format, per request too): "none" leaves the thinking in content; "deepseek" (and
"auto") moves it to reasoning_content; "deepseek-legacy" does that and keeps it in content too.
A thinking budget (llama-server's reasoning_budget_tokens and --reasoning-budget, Anthropic's
thinking.budget_tokens) is enforced by the constraint engine: at most that many tokens of
thinking, then </think> is forced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember.grammar import Constraint, lark_json
from ember.server.errors import bad_request
from ember.server.fields import Fields

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
EFFORTS = ("none", "minimal", "low", "medium", "high")
# Variables ember's renderer sets itself; a request's chat_template_kwargs may not replace them.
_RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"})
# Between </think> and the answer, as the models write it ("</think>\n\n").
_GAP = r"/\n{0,2}/"


def is_reasoning_template(source: str) -> bool:
    return CLOSE in source


@dataclass(frozen=True)
class ReasoningRequest:
    """What a request asks about thinking."""

    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # into the chat template
    enabled: bool = True          # False: the request turned thinking off
    format: str = "auto"          # FORMATS
    budget: int | None = None     # tokens of thinking at most; None: no limit

    @property
    def parse(self) -> bool:
        return self.format != "none"


def parse_request(body: Mapping[str, Any], default_format: str = "auto",
                  default_budget: int | None = None,
                  budget: int | None = None) -> ReasoningRequest:
    """The thinking fields of a chat body: chat_template_kwargs (vLLM's: extra variables of the
    chat template), reasoning_effort, reasoning_format and reasoning_budget_tokens
    (llama-server's, -1: the server's). `budget` (Anthropic's thinking.budget_tokens, already
    read) wins over both."""
    fields = Fields(body)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise bad_request("'chat_template_kwargs' must be an object of template variables, "
                          "like {\"enable_thinking\": false}", param="chat_template_kwargs",
                          code="invalid_type")
    reserved = sorted(set(kwargs) & _RESERVED)
    if reserved:
        raise bad_request(f"'chat_template_kwargs' cannot set '{reserved[0]}': the server "
                          "renders it from the request", param="chat_template_kwargs",
                          code="invalid_value")
    variables = dict(kwargs)
    enabled = True
    if "enable_thinking" in variables:
        value = variables["enable_thinking"]
        if not isinstance(value, bool):
            raise bad_request("'chat_template_kwargs.enable_thinking' must be a boolean",
                              param="chat_template_kwargs.enable_thinking",
                              code="invalid_type")
        enabled = value
    effort = fields.string("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad_request(f"'reasoning_effort' must be one of {', '.join(EFFORTS)}, got "
                              f"{effort[:40]!r}", param="reasoning_effort",
                              code="invalid_value")
        if effort == "none":
            enabled = False
            variables.setdefault("enable_thinking", False)
        else:
            variables.setdefault("reasoning_effort", effort)
    fmt = fields.string("reasoning_format") or default_format
    if fmt not in FORMATS:
        raise bad_request(f"'reasoning_format' must be one of {', '.join(FORMATS)}, got "
                          f"{fmt[:40]!r}", param="reasoning_format", code="invalid_value")
    asked = fields.integer("reasoning_budget_tokens", low=-1)
    if budget is None:
        budget = default_budget if asked is None or asked == -1 else asked
    return ReasoningRequest(variables, enabled, fmt, budget)


@dataclass(frozen=True)
class Thinking:
    """How one answer's thinking is read: the reasoning format (not "none"), whether the
    prompt opened the think block, and whether it was open before the prompt's prefill (the
    continued assistant message, for a reply that repeats it: with_prefill)."""

    format: str
    opened: bool
    opened_before_prefill: bool

    @property
    def keep_in_content(self) -> bool:
        return self.format == "deepseek-legacy"

    def splitter(self, with_prefill: bool = False) -> ReasoningSplitter:
        return ReasoningSplitter(self.opened_before_prefill if with_prefill else self.opened)

    def split(self, text: str, with_prefill: bool = False) -> tuple[str, str]:
        """(reasoning, content) of a whole answer; the content keeps the think block with
        deepseek-legacy."""
        thought, content = self.splitter(with_prefill).push(text, final=True)
        return thought, text if self.keep_in_content else content


def starts_open(prompt_text: str) -> bool:
    """The prompt ends inside a think block (DeepSeek-R1's templates open it; a continued
    assistant message may): the answer begins with thinking."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


def _answer_rule(constraint: Constraint | None) -> str:
    """A Lark rule body for the answer after </think>: the constraint, nested."""
    if constraint is None:
        return "/(.|\\n)*/"
    if constraint.kind == "json_schema":
        return lark_json(json.loads(constraint.text), constraint.bounds)
    if constraint.kind == "regex":
        return "/" + constraint.text.replace("/", "\\/") + "/"
    kind, grammar = constraint.llguidance_input()  # gbnf becomes lark here
    return "%lark {\n" + grammar + "\n}"


def thinking_constraint(constraint: Constraint | None, budget: int | None,
                        opened: bool) -> Constraint:
    """The whole answer of a thinking model: its think block (at most `budget` tokens of
    thinking, then </think> is forced), then the answer matching `constraint`. `opened`: the
    prompt already opened the think block (starts_open); else the model opens it, or answers
    without thinking."""
    think = f'"{CLOSE}"' if budget == 0 else f'thinking "{CLOSE}"'
    block = think if opened else f'"{OPEN}" {think}'
    start = f"start: {block} {_GAP} answer" if opened else f"start: ({block} {_GAP})? answer"
    rules = [start, f"answer: {_answer_rule(constraint)}"]
    if budget != 0:
        # The thinking is any text without </think>, which ends it.
        limit = f"[max_tokens={budget}]" if budget is not None else ""
        rules += [f"thinking{limit}: THINKING",
                  "THINKING: /(.|\\n)*/ & ~/(.|\\n)*<\\/think>(.|\\n)*/"]
    return Constraint("lark", "\n".join(rules) + "\n",
                      param=constraint.param if constraint is not None else None)


class ReasoningSplitter:
    """Splits an answer's text, delta by delta, into (reasoning, content): the text of its
    leading think block and the rest. Text that may still turn out to be a tag is held back
    until it is known; whitespace around the thinking and before the content is dropped (as
    llama-server trims them). Pushing the same text in any pieces gives the same parts."""

    def __init__(self, opened: bool) -> None:
        self._state = "thinking_lead" if opened else "start"
        self._held = ""

    def push(self, text: str, final: bool = False) -> tuple[str, str]:
        reasoning, content = [], []
        self._held += text
        while True:
            held = self._held
            if self._state == "start":
                stripped = held.lstrip()
                if stripped.startswith(OPEN):
                    self._state, self._held = "thinking_lead", stripped[len(OPEN):]
                    continue
                if not final and OPEN.startswith(stripped):
                    break  # maybe the opening tag, still arriving
                self._state = "content"
                continue
            if self._state in ("thinking_lead", "answer_lead"):
                self._held = held = held.lstrip()
                if not held and not final:
                    break
                self._state = "thinking" if self._state == "thinking_lead" else "content"
                continue
            if self._state == "thinking":
                end = held.find(CLOSE)
                if end >= 0:
                    reasoning.append(held[:end].rstrip())
                    self._state, self._held = "answer_lead", held[end + len(CLOSE):]
                    continue
                keep = 0 if final else _held_back(held)
                reasoning.append(held[:len(held) - keep])
                self._held = held[len(held) - keep:]
                break
            content.append(held)
            self._held = ""
            break
        return "".join(reasoning), "".join(content)


def _held_back(text: str) -> int:
    """How many trailing characters of thinking to hold: trailing whitespace and any end of it
    that could begin </think>."""
    n = 0
    for k in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-k:]):
            n = k
            break
    stripped = text[:len(text) - n]
    return n + len(stripped) - len(stripped.rstrip())
