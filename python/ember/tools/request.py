"""What a chat request asks about tools: the checked `tools`, `tool_choice` and
`parallel_tool_calls` of OpenAI's chat completions, and the JSON schema a forced call must follow.

    request = parse_tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))

`tool_choice` "auto" (the default with tools) lets the model choose, "none" answers without tools
(they are left out of the prompt, and the output is not parsed for calls), "required" and
{"type": "function", "function": {"name": ...}} force a call: generation is then constrained
(ember.grammar) to call_constraint(), a valid call of the allowed functions whose arguments
match their parameter schemas.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ember.grammar import BOUNDS, Constraint, JsonBounds
from ember.tools.calls import ToolFormat

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class ToolsError(ValueError):
    """A bad `tools` / `tool_choice` field: the message says what, `param` which field."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # [{"type": "function", "function": {"name", "description"?,
                                 #   "parameters"}}], as the chat template's `tools` variable
    choice: str                  # "auto", "none", "required" or "function" (a named one)
    function: str | None = None  # the forced function's name (choice "function")
    parallel: bool = True        # may the model make several calls in one answer

    @property
    def offered(self) -> bool:
        """Does the model see the tools (and is its output parsed for calls)?"""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


def _tool(value: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if not isinstance(value, Mapping) or value.get("type") != "function":
        raise ToolsError(f"'{param}' must be {{\"type\": \"function\", \"function\": {{...}}}}, "
                         f"got {str(value)[:80]}", param)
    function = value.get("function")
    if not isinstance(function, Mapping):
        raise ToolsError(f"'{param}.function' must be an object with a 'name'", param)
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolsError(f"'{param}': the function's name must be 1-64 letters, digits, '_', "
                         f"'.' or '-', got {str(name)[:80]!r}", param)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolsError(f"'{param}': the function's description must be a string", param)
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise ToolsError(f"'{param}': the function's parameters must be a JSON schema "
                         "object", param)
    try:
        json.dumps(parameters)
    except (RecursionError, TypeError, ValueError):
        raise ToolsError(f"'{param}': the function's parameters nest too deeply to be a "
                         "schema", param) from None
    out: dict[str, Any] = {"name": name}
    if description is not None:
        out["description"] = description
    out["parameters"] = dict(parameters)
    if function.get("strict") is not None:
        out["strict"] = bool(function.get("strict"))
    return {"type": "function", "function": out}


def parse_tools(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None
                ) -> ToolRequest | None:
    """The checked tool fields of a request; None when it offers no tools. ToolsError for a
    malformed field or a named function that is not among the tools."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise ToolsError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolsError("'tools' must be an array of {\"type\": \"function\", ...}", "tools",
                         "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise ToolsError(f"'tools' has {len(tools)} tools; at most {MAX_TOOLS} are allowed",
                         "tools")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise ToolsError(f"'tools' names a function twice: {names}", "tools")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolsError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls",
                         "invalid_type")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    choice, function = _choice(tool_choice, names)
    return ToolRequest(checked, choice, function, parallel)


def _choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("auto", "none", "required"):
        return value, None
    if isinstance(value, Mapping) and value.get("type") == "function" and \
            isinstance(value.get("function"), Mapping):
        name = value["function"].get("name")
        if name not in names:
            raise ToolsError(f"'tool_choice' names the function {str(name)[:80]!r}, which is "
                             f"not among 'tools' ({', '.join(names)})", "tool_choice")
        return "function", name
    raise ToolsError("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                     f"\"function\", \"function\": {{\"name\": ...}}}}, got {str(value)[:80]}",
                     "tool_choice")


# --- forced calls ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CallConstraint:
    """A forced call in the model's own format: `prefix` (appended to the prompt, and fed to the
    output parser first), then JSON valid against `schema`, then `suffix`."""

    prefix: str
    schema: dict[str, Any]
    suffix: str = ""

    def grammar(self, bounds: JsonBounds = BOUNDS) -> Constraint:
        """The constraint to sample under (SamplingParams.constraint), its JSON bounded by
        `bounds`."""
        return Constraint("json_schema", Constraint.json_schema(self.schema).text,
                          param="tool_choice", bounds=bounds)


def call_constraint(request: ToolRequest, fmt: ToolFormat) -> CallConstraint:
    """What a request with tool_choice "required" or a named function must generate: one call
    (or, in formats that list calls and with parallel calls allowed, one or more) of the allowed
    functions, whose arguments match each one's parameter schema. The prompt ends with
    `prefix` (PreparedChat.answer_prefix), which the output parser reads first; generation
    samples under grammar() (the schema); `suffix` is optional for the parser (a hermes call
    without its closing tag still counts)."""
    tools = [t["function"] for t in request.tools
             if request.function is None or t["function"]["name"] == request.function]
    key = "parameters" if fmt.name == "llama3" else "arguments"
    calls = [{"type": "object",
              "properties": {"name": {"const": t["name"]}, key: t["parameters"]},
              "required": ["name", key], "additionalProperties": False} for t in tools]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    many: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    if not request.parallel:
        many["maxItems"] = 1
    if fmt.name == "hermes":
        return CallConstraint("<tool_call>\n", one, "\n</tool_call>")
    if fmt.name == "llama3":
        return CallConstraint("", one)
    if fmt.name == "mistral":
        return CallConstraint("[TOOL_CALLS]", many)
    return CallConstraint("", {"type": "object", "properties": {"tool_calls": many},
                               "required": ["tool_calls"], "additionalProperties": False})
