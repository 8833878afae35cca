"""Constrained decoding: what a request's output must match, compiled for a model's vocabulary.

A Constraint is a JSON Schema, a GBNF grammar (llama.cpp's), a Lark grammar (llguidance's
dialect, which can embed JSON Schemas with %json) or a regex. GrammarCompiler turns it into an
ember._core.Grammar with llguidance, the grammar engine llama.cpp, vLLM and SGLang use. The C++
engine opens llguidance's shared library and computes every step's token mask on its own
thread without the GIL; the sampler masks the logits before any sampling stage, and allows
end-of-generation tokens only where the output is complete.

JSON Schemas are compiled strictly: a keyword llguidance cannot enforce is an error naming it
("Unimplemented keys: ['uniqueItems']"), never dropped. oneOf is enforced as anyOf (exact when
its branches are disjoint, as discriminated unions are).

Where JSON allows anything a weak model can spin forever: "1111..." for an integer, endless
fraction digits, endless indentation. Every JSON constraint ember builds is bounded there
(JsonBounds: at most 16 integer digits, 10 fraction digits, no exponent; between tokens one
space, or a line break and at most 20 characters of indentation). llguidance has no option for
number digits, so the bounds are written into the schema before it compiles: a number or
integer without a minimum/maximum gets +-10^16 (exclusive), a number without multipleOf gets
multipleOf 10^-10, a time, date-time, e-mail or host name without maxLength gets its format's
longest (FORMAT_MAX_LENGTH), and wherever the schema allows any value ({}, an object's unlisted
properties, an array's unlisted items) it allows any value built from those bounded numbers. A
schema's own minimum/maximum/multipleOf/maxLength replace the bound there, so a request that
needs wider values says so in its schema. Only the compiled grammar is narrowed: every output
still validates against the schema as given. The server's flags (--json-int-digits,
--json-frac-digits, --json-indent) set other bounds for every JSON constraint it builds.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ember import _core

KINDS = ("json_schema", "gbnf", "lark", "regex")


# The schema keywords that hold subschemas: a dict of them, a list of them, or one.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
# Keywords that say nothing about a value: a schema of only these allows any value.
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                "writeOnly", "$schema", "$id"}
_ANY = "ember_bounded_any"

# The longest value of a string format whose grammar is otherwise unbounded, where the schema
# gives no maxLength: llguidance's time and date-time take any number of fraction-of-second
# digits (bounded at 9, nanoseconds: "23:59:60.123456789+01:00"), and an e-mail address or a
# host name any length (bounded at RFC 5321's 254 and RFC 1035's 253 characters).
FORMAT_MAX_LENGTH = {"time": 24, "date-time": 35, "email": 254, "hostname": 253}


class ConstraintError(ValueError):
    """A schema or grammar that cannot be compiled; the message says which part and why.
    param: the request field it came from (for the server's 400), when known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class JsonBounds:
    """How long a JSON number may be where its schema does not say, and how much whitespace may
    come between two JSON tokens. int_digits: digits before the point (llama.cpp's JSON grammars
    allow 16 too); frac_digits: digits after it (10: the finest multipleOf llguidance enforces
    exactly is 10^-11). Exponents are never written: a number within +-10^16 needs none.
    indent: between two tokens at most one space, or one line break and up to `indent` spaces
    or tabs (llama.cpp's JSON grammars allow 20 too): room for pretty-printing, none for a weak
    model to spin in whitespace; -1: no whitespace at all (compact JSON)."""

    int_digits: int = 16
    frac_digits: int = 10
    indent: int = 20

    def __post_init__(self) -> None:
        if not 1 <= self.int_digits <= 18:  # llguidance's integer ranges are 64-bit
            raise ConstraintError(f"int_digits must be 1 to 18, got {self.int_digits}")
        if not 0 <= self.frac_digits <= 10:
            raise ConstraintError(f"frac_digits must be 0 to 10, got {self.frac_digits}")
        if not -1 <= self.indent <= 256:
            raise ConstraintError(f"indent must be -1 (compact) to 256, got {self.indent}")

    @property
    def whitespace(self) -> str:
        """The whitespace between two JSON tokens, as a regex (llguidance's whitespace_pattern)."""
        if self.indent < 0:
            return ""
        return rf"\x20|\x0D?\x0A[\x20\x09]{{0,{self.indent}}}"


BOUNDS = JsonBounds()

@dataclass(frozen=True)
class Constraint:
    """kind: "json_schema" (text: the schema as JSON), "gbnf", "lark" or "regex". param: the
    request field it came from, for error messages (the server sets it). bounds: how long a
    JSON schema's numbers may be where it does not say (BOUNDS unless with_bounds changes it)."""

    kind: str
    text: str
    param: str | None = field(default=None, compare=False)
    bounds: JsonBounds = BOUNDS

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

    def with_bounds(self, bounds: JsonBounds) -> Constraint:
        return dataclasses.replace(self, bounds=bounds)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}; use one of {', '.join(KINDS)}")

    def llguidance_input(self) -> tuple[str, str]:
        """(kind, data) as GrammarCompiler.compile takes them."""
        if self.kind == "json_schema":
            return "json_schema", _with_options(json.loads(self.text), self.param, self.bounds)
        if self.kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                return "lark", gbnf_to_lark(self.text)
            except Exception as err:  # its parser raises several types, all for bad grammar text
                raise ConstraintError(f"the GBNF grammar cannot be read: {err}", self.param) from None
        return self.kind, self.text


def _with_options(schema: Mapping[str, Any] | bool, param: str | None, bounds: JsonBounds) -> str:
    """The schema as llguidance compiles it: strict, its numbers and whitespace bounded."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if "x-guidance" in schema:
        raise ConstraintError("the JSON schema's 'x-guidance' key is reserved (ember sets it)", param)
    defs = schema.get("$defs")
    if _ANY in (defs if isinstance(defs, Mapping) else {}):
        raise ConstraintError(f"the JSON schema's '$defs.{_ANY}' is reserved (ember sets it)", param)
    bounded = _bounded(schema, bounds)
    bounded["$defs"] = {**(defs if isinstance(defs, Mapping) else {}), _ANY: _bounded_any(bounds)}
    options = {"whitespace_pattern": bounds.whitespace, "coerce_one_of": True, "lenient": False}
    return json.dumps({**bounded, "x-guidance": options})


def _number_bounds(node: dict[str, Any], integer: bool, bounds: JsonBounds) -> None:
    """Adds the missing side(s) of a number's range, and its fraction step, in place."""
    limit = 10 ** bounds.int_digits
    has_low = "minimum" in node or "exclusiveMinimum" in node
    has_high = "maximum" in node or "exclusiveMaximum" in node
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if not has_low and not (isinstance(high, (int, float)) and high <= -limit):
        node["exclusiveMinimum"] = -limit
    if not has_high and not (isinstance(low, (int, float)) and low >= limit):
        node["exclusiveMaximum"] = limit
    step = 10.0 ** -bounds.frac_digits
    numbers = (int, float)
    narrow = isinstance(low, numbers) and isinstance(high, numbers) and high - low < 2 * step
    if not integer and "multipleOf" not in node and not narrow:  # a range finer than the step keeps its own
        node["multipleOf"] = 1 if bounds.frac_digits == 0 else float(f"1e-{bounds.frac_digits}")


def _bounded(schema: Any, bounds: JsonBounds) -> Any:
    """A copy of `schema` (a subschema, or anything a keyword holds) with numbers bounded and
    every "any value" place pointing at the bounded any-value definition."""
    if schema is True:
        return {"$ref": f"#/$defs/{_ANY}"}
    if not isinstance(schema, Mapping):
        return schema
    if not set(schema) - _ANNOTATIONS:
        return {"$ref": f"#/$defs/{_ANY}"}
    node = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), Mapping):
            node[key] = {name: _bounded(sub, bounds) for name, sub in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_bounded(sub, bounds) for sub in node[key]]
    for key in _SCHEMA_ONE:
        if key in node:
            node[key] = _bounded(node[key], bounds)
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    if "number" in types or "integer" in types:
        _number_bounds(node, "number" not in types, bounds)
    if node.get("format") in FORMAT_MAX_LENGTH and "maxLength" not in node:
        node["maxLength"] = FORMAT_MAX_LENGTH[node["format"]]
    if "object" in types and "additionalProperties" not in node and "patternProperties" not in node:
        node["additionalProperties"] = {"$ref": f"#/$defs/{_ANY}"}
    if "array" in types and "items" not in node:
        node["items"] = {"$ref": f"#/$defs/{_ANY}"}
    return node


def _bounded_any(bounds: JsonBounds) -> dict[str, Any]:
    """Any JSON value, its numbers bounded (llguidance's own any-value has unbounded ones)."""
    number: dict[str, Any] = {"type": "number"}
    _number_bounds(number, False, bounds)
    ref = {"$ref": f"#/$defs/{_ANY}"}
    return {"anyOf": [{"type": "null"}, {"type": "boolean"}, number, {"type": "string"},
                      {"type": "array", "items": ref},
                      {"type": "object", "additionalProperties": ref}]}


def lark_json(schema: Mapping[str, Any] | bool, bounds: JsonBounds = BOUNDS) -> str:
    """`%json {...}`: a JSON value matching `schema`, for a rule of a Lark constraint, with the
    same strictness and whitespace bounds as Constraint.json_schema. E.g. a tool call:
    Constraint.lark('start: "<tool_call>" call "</tool_call>"\ncall: ' + lark_json(call_schema))"""
    return "%json " + _with_options(schema, None, bounds)


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
