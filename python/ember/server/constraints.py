"""The constraint fields of a request body: OpenAI's response_format (json_object, json_schema
with name/schema/strict) and llama-server's json_schema and grammar (GBNF). At most one may be
given. Compiling (which names any schema keyword that cannot be enforced) happens when the
request is submitted, still before any response starts, so its errors are 400s too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ember.grammar import Constraint, ConstraintError
from ember.server.errors import APIError, bad_request


def _invalid(param: str, message: str) -> APIError:
    return bad_request(f"'{param}' {message}", param=param, code="invalid_value")


def _response_format(value: Any) -> Constraint | None:
    if not isinstance(value, Mapping):
        raise _invalid("response_format", "must be an object like {\"type\": \"json_object\"}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    if kind != "json_schema":
        raise _invalid("response_format", "'type' must be \"text\", \"json_object\" or "
                       f"\"json_schema\", got {kind!r}"[:200])
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise _invalid("response_format.json_schema", "must be an object with 'name' and 'schema'")
    name, strict = spec.get("name"), spec.get("strict")
    if name is not None and not isinstance(name, str):
        raise _invalid("response_format.json_schema.name", "must be a string")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid("response_format.json_schema.strict", "must be a boolean")
    # Strict or not, the schema is enforced exactly (or refused): ember has no lenient mode.
    schema = spec.get("schema", {"type": "object"})
    return _schema(schema, "response_format.json_schema.schema")


def _schema(schema: Any, param: str) -> Constraint:
    if not isinstance(schema, (Mapping, bool)):
        raise _invalid(param, "must be a JSON Schema (an object or a boolean)")
    try:
        return Constraint("json_schema", Constraint.json_schema(schema).text, param=param)
    except ConstraintError as err:
        raise bad_request(f"'{param}': {err}", param=param, code="invalid_value") from None


def parse_constraint(body: Mapping[str, Any]) -> Constraint | None:
    """The one constraint the body asks for, or None. A 400 naming the field for a bad one."""
    given = [name for name in ("response_format", "json_schema", "grammar") if body.get(name) is not None
             and body.get(name) != "" and body.get(name) != {"type": "text"}]
    if len(given) > 1:
        raise bad_request(f"give only one of {', '.join(repr(g) for g in given)}: each constrains "
                          "the whole output", param=given[1], code="invalid_value")
    if not given:
        return None
    if given[0] == "response_format":
        return _response_format(body["response_format"])
    if given[0] == "json_schema":
        return _schema(body["json_schema"], "json_schema")
    grammar = body["grammar"]
    if not isinstance(grammar, str):
        raise _invalid("grammar", "must be a GBNF grammar (a string)")
    return Constraint("gbnf", grammar, param="grammar")
