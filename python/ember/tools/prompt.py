"""Tools in the prompt: a chat's tools, assistant tool calls and tool results, rendered through
the model's own chat template, or in a standard form where the template has no place for them.

What a template can render is found by rendering it on probe conversations (as minja, the
renderer of llama.cpp, does): does the `tools` variable reach the text, do assistant
`tool_calls`, do they expect `arguments` as an object (as Hugging Face templates do) or as the
JSON string OpenAI clients send, does a "tool" message reach the text, is there a system role.
Where it cannot:
- the tools go into the system prompt (STANDARD_TOOL_PROMPT), asking for the generic JSON format;
- an assistant's calls become its text, written in the generic format;
- a tool result becomes a user message holding {"tool_response": {...}}.

    chat = prepare_chat(template, tokenizer, messages, tools)   # tools: ember.tools.request.ToolRequest
    text = template.render(chat.messages, **chat.variables)      # chat.format parses the answer
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ember.chat.template import ChatTemplate, ChatTemplateError, Message
from ember.tools.calls import GENERIC, ToolFormat, detect_format
from ember.tools.request import CallConstraint, ToolRequest, call_constraint

STANDARD_TOOL_PROMPT = (
    "You can call these tools (functions); each is given with the JSON schema of its "
    "arguments:\n{tools}\n\n"
    "To call one or more of them, answer with only this JSON and nothing else:\n"
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}\n'
    "A tool's result comes back in a message holding {{\"tool_response\": ...}}. "
    "When no tool is needed, answer normally."
)


@dataclass(frozen=True)
class TemplateToolSupport:
    tools: bool = False             # renders the `tools` variable
    tool_calls: bool = False        # renders an assistant message's tool_calls
    object_arguments: bool = True   # ... expecting function.arguments as an object
    tool_role: bool = False         # renders a "tool" message
    system_role: bool = True        # renders a "system" message


_PROBE_TOOL = {"type": "function", "function": {
    "name": "ember_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {"ember_probe_arg": {"type": "integer"}}}}}
_PROBE_USER = {"role": "user", "content": "ember_probe_question"}


def _probe_call(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": "probe0001", "type": "function",
        "function": {"name": "ember_probe_call", "arguments": arguments}}]}


_PROBE_RESULT = {"role": "tool", "tool_call_id": "probe0001", "name": "ember_probe_call",
                 "content": "ember_probe_result"}


def _renders(template: ChatTemplate, messages: Sequence[Message], needle: str,
             **variables: Any) -> str | None:
    try:
        text = template.render(messages, add_generation_prompt=False, **variables)
    except ChatTemplateError:
        return None
    return text if needle in text else None


@lru_cache(maxsize=16)
def template_support(source: str, bos_token: str, eos_token: str) -> TemplateToolSupport:
    """What a template renders of tools (see the module doc), cached per template."""
    template = ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
    tools = _renders(template, [_PROBE_USER], "ember_probe_tool", tools=[_PROBE_TOOL]) \
        is not None
    calls, object_arguments = False, True
    for arguments in ({"ember_probe_arg": 1}, '{"ember_probe_arg": 1}'):
        text = _renders(template, [_PROBE_USER, _probe_call(arguments)], "ember_probe_call")
        # The arguments must show, and not as a Python dict's repr (a template that prints
        # them as they are wants OpenAI's JSON string).
        if text is not None and "ember_probe_arg" in text and "{'ember_probe_arg'" not in text:
            calls, object_arguments = True, isinstance(arguments, dict)
            break
    role = False
    if calls:
        arguments = {"ember_probe_arg": 1} if object_arguments else '{"ember_probe_arg": 1}'
        role = _renders(template, [_PROBE_USER, _probe_call(arguments), _PROBE_RESULT],
                        "ember_probe_result") is not None
    system = _renders(template, [{"role": "system", "content": "ember_probe_system"},
                                 _PROBE_USER], "ember_probe_system") is not None
    return TemplateToolSupport(tools, calls, object_arguments, role, system)


def support_of(template: ChatTemplate) -> TemplateToolSupport:
    return template_support(template.source, template.bos_token, template.eos_token)


def vocabulary_lookup(tokenizer: Any) -> Any:
    """marker -> its token id when the vocabulary has it as one token, else None."""
    def token_id(marker: str) -> int | None:
        try:
            ids = list(tokenizer.encode(marker, False, True))
        except (ValueError, RuntimeError):
            return None
        if len(ids) == 1 and tokenizer.token_to_piece(ids[0]) == marker.encode():
            return ids[0]
        return None
    return token_id


@dataclass
class PreparedChat:
    messages: list[dict[str, Any]]
    variables: dict[str, Any] = field(default_factory=dict)  # `tools`, for the template
    format: ToolFormat | None = None  # the format to parse the answer in; None: not parsed
    keep_tokens: list[int] = field(default_factory=list)  # control tokens to keep as text
    constraint: CallConstraint | None = None  # a forced call (tool_choice required / named)

    @property
    def answer_prefix(self) -> str:
        """Text the answer starts with, written after the generation prompt: a forced call's
        opening markup (`<tool_call>\n`), which the output parser reads first."""
        return self.constraint.prefix if self.constraint is not None else ""


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _calls_as_text(calls: Sequence[Mapping[str, Any]]) -> str:
    listed = [{"name": c["function"]["name"],
               "arguments": _arguments_object(c["function"].get("arguments"))} for c in calls]
    return json.dumps({"tool_calls": listed}, ensure_ascii=False)


def _checked_calls(message: Mapping[str, Any], i: int) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        raise ChatTemplateError(f"messages[{i}].tool_calls must be an array")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"messages[{i}].tool_calls[{j}] must be {{\"type\": "
                                    "\"function\", \"function\": {\"name\", \"arguments\"}}")
    return calls


def prepare_chat(template: ChatTemplate, tokenizer: Any, messages: Sequence[Message],
                 tools: ToolRequest | None) -> PreparedChat:
    """The messages and variables to render `messages` with `tools` in `template`, and how to
    read the answer. A chat without tools or tool messages passes unchanged."""
    offered = tools is not None and tools.offered
    if not offered and not any(m.get("tool_calls") or m.get("role") == "tool"
                               for m in messages):
        return PreparedChat([dict(m) for m in messages])
    support = support_of(template)
    lookup = vocabulary_lookup(tokenizer)
    native = offered and support.tools
    fmt = detect_format(template.source, lambda m: lookup(m) is not None) if native else GENERIC
    names: dict[str, str] = {}  # call id -> function name, for tool results without a name
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        copy = dict(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = _checked_calls(message, i)
            for call in calls:
                if isinstance(call.get("id"), str):
                    names[call["id"]] = call["function"]["name"]
            if support.tool_calls:
                copy["tool_calls"] = [{
                    "id": call.get("id", ""), "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": (
                        _arguments_object(call["function"].get("arguments"))
                        if support.object_arguments else
                        call["function"].get("arguments") if isinstance(
                            call["function"].get("arguments"), str) else
                        json.dumps(call["function"].get("arguments"), ensure_ascii=False))},
                } for call in calls]
                copy["content"] = _text(message.get("content"))
            else:
                text = _text(message.get("content"))
                copy.pop("tool_calls")
                copy["content"] = (text + "\n" if text else "") + _calls_as_text(calls)
        elif message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or names.get(call_id if isinstance(call_id, str) else "")
            if support.tool_role:
                copy["content"] = _text(message.get("content"))
                if name:
                    copy["name"] = name
            else:
                response = {"name": name, "tool_call_id": call_id,
                            "content": _text(message.get("content"))}
                copy = {"role": "user", "content": json.dumps(
                    {"tool_response": {k: v for k, v in response.items() if v is not None}},
                    ensure_ascii=False)}
        out.append(copy)
    variables: dict[str, Any] = {}
    if native:
        assert tools is not None
        variables["tools"] = tools.tools
    elif offered:
        assert tools is not None
        _add_standard_prompt(out, tools, support)
    keep = [t for t in (lookup(m) for m in fmt.markers) if t is not None] if offered else []
    constraint = call_constraint(tools, fmt) if tools is not None and tools.forced else None
    return PreparedChat(out, variables, fmt if offered else None, keep, constraint)


def standard_tool_prompt(tools: ToolRequest) -> str:
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools.tools)
    return STANDARD_TOOL_PROMPT.format(tools=listed)


def _add_standard_prompt(messages: list[dict[str, Any]], tools: ToolRequest,
                         support: TemplateToolSupport) -> None:
    prompt = standard_tool_prompt(tools)
    if messages and messages[0].get("role") == "system" and support.system_role:
        messages[0]["content"] = _text(messages[0].get("content")) + "\n\n" + prompt
    elif support.system_role:
        messages.insert(0, {"role": "system", "content": prompt})
    else:
        first = next((m for m in messages if m.get("role") == "user"), None)
        if first is None:
            messages.insert(0, {"role": "user", "content": prompt})
        else:
            first["content"] = prompt + "\n\n" + _text(first.get("content"))
