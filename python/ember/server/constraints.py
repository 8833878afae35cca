"""The constraint fields of a request body: OpenAI's response_format (json_object, json_schema
with name/schema/strict), llama-server's json_schema and grammar (GBNF), and vLLM's
structured_outputs ({"json"|"regex"|"choice"|"grammar"|"json_object": ...}) and its older
guided_json, guided_regex, guided_choice and guided_grammar (GBNF, or Lark when it has no
'::='). At most one may be given. Compiling (which names any schema keyword that cannot be
enforced) happens when the request is submitted, still before any response starts, so its errors are 400s too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ember.grammar import BOUNDS, Constraint, ConstraintError, JsonBounds
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


# vLLM's structured_outputs keys, each as its guided_* field reads it.
_STRUCTURED = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice",
               "grammar": "guided_grammar", "json_object": "json_object"}
# vLLM's options of its backends: accepted at the value that changes nothing.
_STRUCTURED_OFF = {"disable_fallback": False, "disable_any_whitespace": False,
                   "disable_additional_properties": False, "whitespace_pattern": None,
                   "structural_tag": None, "backend": None}
FIELDS = ("response_format", "json_schema", "grammar", "structured_outputs", "guided_json",
          "guided_regex", "guided_choice", "guided_grammar")


def _grammar(grammar: Any, param: str) -> Constraint:
    if not isinstance(grammar, str):
        raise _invalid(param, "must be a GBNF grammar (a string)")
    return Constraint("gbnf", grammar, param=param)


def _guided(name: str, value: Any, param: str) -> Constraint | None:
    """One of vLLM's guided_* values (or a structured_outputs key's, under `param`)."""
    if name == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _invalid(param, "must be a JSON Schema (an object, or its JSON text)") \
                    from None
        return _schema(value, param)
    if name == "guided_regex":
        if not isinstance(value, str):
            raise _invalid(param, "must be a regular expression (a string)")
        return Constraint("regex", value, param=param)
    if name == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise _invalid(param, "must be a non-empty array of strings")
        return Constraint("lark", "start: " + " | ".join(json.dumps(c) for c in value) + "\n",
                          param=param)
    if name == "guided_grammar":
        if not isinstance(value, str):
            raise _invalid(param, "must be a grammar (GBNF, or Lark) as a string")
        return Constraint("gbnf" if "::=" in value else "lark", value, param=param)
    if value is True:  # json_object
        return Constraint.json_object()
    if value is not False:
        raise _invalid(param, "must be a boolean")
    return None


def _structured_outputs(value: Any) -> Constraint | None:
    if not isinstance(value, Mapping):
        raise _invalid("structured_outputs", "must be an object like {\"json\": {...}}")
    for key, off in _STRUCTURED_OFF.items():
        if value.get(key, off) != off:
            raise bad_request(f"'structured_outputs.{key}' is not supported by ember (its one "
                              "backend is llguidance); omit it", param=f"structured_outputs.{key}",
                              code="unsupported_parameter")
    unknown = sorted(set(value) - set(_STRUCTURED) - set(_STRUCTURED_OFF))
    if unknown:
        raise _invalid(f"structured_outputs.{unknown[0]}", "is not a field of structured_outputs "
                       f"(known: {', '.join(_STRUCTURED)})")
    given = [k for k in _STRUCTURED if value.get(k) is not None and value.get(k) is not False]
    if not given:
        return None
    if len(given) > 1:
        raise _invalid("structured_outputs", f"must give one of {', '.join(_STRUCTURED)}, "
                       f"got {len(given)}: {', '.join(given)}")
    return _guided(_STRUCTURED[given[0]], value[given[0]], f"structured_outputs.{given[0]}")


def parse_constraint(body: Mapping[str, Any], bounds: JsonBounds = BOUNDS) -> Constraint | None:
    """The one constraint the body asks for, or None, a JSON one with `bounds` (the server's
    --json-* flags). A 400 naming the field for a bad one. vLLM's guided_decoding_backend picks
    among its backends; ember's one (llguidance) serves any of them."""
    constraint = _parse_constraint(body)
    return constraint.with_bounds(bounds) if constraint is not None else None


def _parse_constraint(body: Mapping[str, Any]) -> Constraint | None:
    if body.get("guided_whitespace_pattern") is not None:
        raise bad_request("'guided_whitespace_pattern' is not supported by ember (JSON "
                          "whitespace is bounded by ember's own pattern)",
                          param="guided_whitespace_pattern", code="unsupported_parameter")
    if not isinstance(body.get("guided_decoding_backend", ""), str):
        raise _invalid("guided_decoding_backend", "must be a string")
    given = [name for name in FIELDS if body.get(name) is not None
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
    if given[0] == "grammar":
        return _grammar(body["grammar"], "grammar")
    if given[0] == "structured_outputs":
        return _structured_outputs(body["structured_outputs"])
    return _guided(given[0], body[given[0]], given[0])
