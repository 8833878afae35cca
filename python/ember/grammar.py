"""Constrained decoding: what a request's output must match, compiled for a model's vocabulary.

A Constraint is a JSON Schema, a GBNF grammar (llama.cpp's), a Lark grammar (llguidance's
dialect, which can embed JSON Schemas with %json) or a regex. GrammarCompiler turns it into an
ember._core.Grammar with llguidance, the grammar engine llama.cpp, vLLM and SGLang use. The C++
engine opens llguidance's shared library and computes every step's token mask on its own
thread without the GIL; the sampler masks the logits before any sampling stage, and allows
end-of-generation tokens only where the output is complete.

JSON Schemas are compiled strictly: a keyword llguidance cannot enforce is an error naming it
("Unimplemented keys: ['uniqueItems']"), never dropped. Whitespace between JSON tokens is
bounded (WHITESPACE), so a weak model cannot spin in it forever; oneOf is enforced as anyOf
(exact when its branches are disjoint, as discriminated unions are).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember import _core

# Between two JSON tokens at most one space, or one line break and up to 20 characters of
# indentation (llama.cpp's JSON grammars allow the same): room for pretty-printing, none for a
# weak model to spin in whitespace.
WHITESPACE = r"\x20|\x0D?\x0A[\x20\x09]{0,20}"

KINDS = ("json_schema", "gbnf", "lark", "regex")


class ConstraintError(ValueError):
    """A schema or grammar that cannot be compiled; the message says which part and why.
    param: the request field it came from (for the server's 400), when known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """kind: "json_schema" (text: the schema as JSON), "gbnf", "lark" or "regex". param: the
    request field it came from, for error messages (the server sets it)."""

    kind: str
    text: str
    param: str | None = field(default=None, compare=False)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str) -> Constraint:
        """A JSON Schema given as a dict (or True: any JSON value) or as its JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise ConstraintError(f"the JSON schema is not valid JSON: {err}") from None
        if not isinstance(schema, (Mapping, bool)):
            raise ConstraintError("a JSON schema must be an object or a boolean, got "
                                  f"{type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))  # key order kept: properties come in it

    @classmethod
    def json_object(cls) -> Constraint:
        """Any one JSON object (response_format {"type": "json_object"})."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def gbnf(cls, grammar: str) -> Constraint:
        return cls("gbnf", grammar)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("lark", grammar)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}; use one of {', '.join(KINDS)}")

    def llguidance_input(self) -> tuple[str, str]:
        """(kind, data) as GrammarCompiler.compile takes them."""
        if self.kind == "json_schema":
            return "json_schema", _with_options(json.loads(self.text), self.param)
        if self.kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                return "lark", gbnf_to_lark(self.text)
            except Exception as err:  # its parser raises several types, all for bad grammar text
                raise ConstraintError(f"the GBNF grammar cannot be read: {err}", self.param) from None
        return self.kind, self.text


def _with_options(schema: Mapping[str, Any] | bool, param: str | None) -> str:
    """The schema as llguidance compiles it: strict, with ember's whitespace bounds."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if "x-guidance" in schema:
        raise ConstraintError("the JSON schema's 'x-guidance' key is reserved (ember sets it)", param)
    options = {"whitespace_pattern": WHITESPACE, "coerce_one_of": True, "lenient": False}
    return json.dumps({**schema, "x-guidance": options})


def lark_json(schema: Mapping[str, Any] | bool) -> str:
    """`%json {...}`: a JSON value matching `schema`, for a rule of a Lark constraint, with the
    same strictness and whitespace bounds as Constraint.json_schema. E.g. a tool call:
    Constraint.lark('start: "<tool_call>" call "</tool_call>"\ncall: ' + lark_json(call_schema))"""
    return "%json " + _with_options(schema, None)


def llguidance_library() -> str:
    """The path of llguidance's shared library (from the installed `llguidance` package)."""
    spec = importlib.util.find_spec("llguidance._lib")
    if spec is None or spec.origin is None:
        raise ConstraintError("constrained decoding needs the llguidance package "
                              "(pip install llguidance==1.8.0)")
    import llguidance._lib  # noqa: F401  (loaded into the process before the C++ core opens it)

    return spec.origin


class GrammarCompiler:
    """Compiles Constraints for one vocabulary; the last 64 grammars are cached (compiling the
    same schema again costs a lookup). Thread-safe."""

    def __init__(self, tokenizer: _core.Tokenizer) -> None:
        self._core = _core.GrammarCompiler(llguidance_library(), tokenizer)

    def compile(self, constraint: Constraint) -> _core.Grammar:
        kind, data = constraint.llguidance_input()
        try:
            return self._core.compile(kind, data)
        except ValueError as err:
            message = str(err).removeprefix("[grammar] ")
            where = f"'{constraint.param}': " if constraint.param else ""
            what = {"json_schema": "JSON schema", "gbnf": "GBNF grammar", "lark": "Lark grammar",
                    "regex": "regex"}[constraint.kind]
            raise ConstraintError(f"{where}the {what} cannot be enforced: {message}",
                                  constraint.param) from None

    @property
    def n_compiled(self) -> int:
        return self._core.n_compiled
