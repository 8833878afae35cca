"""JSON schemas for the structured-output tests: every type and keyword ember enforces, nested
objects, arrays of objects, enums, recursion through $ref, string formats. SCHEMAS holds 64
(name, schema) pairs; UNSUPPORTED the keywords that must be refused with a 400 naming them."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _obj(props: dict[str, Any], required: list[str] | None = None, extra: bool = False) -> Schema:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": extra}


NAME = {"type": "string", "minLength": 1, "maxLength": 24}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}

HAND: list[tuple[str, Schema]] = [
    ("string", {"type": "string", "maxLength": 40}),
    ("integer", {"type": "integer"}),
    ("number", {"type": "number"}),
    ("boolean", {"type": "boolean"}),
    ("null", {"type": "null"}),
    ("type_list", {"type": ["integer", "null"]}),
    ("any_object", {"type": "object"}),
    ("person", _obj({"name": NAME, "age": AGE})),
    ("person_optional", _obj({"name": NAME, "age": AGE, "email": {"type": "string", "format": "email"}},
                             required=["name"])),
    ("open_object", _obj({"id": {"type": "integer"}}, extra=True)),
    ("typed_extra", {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                     "additionalProperties": {"type": "integer"}, "maxProperties": 4}),
    ("enum_strings", {"enum": ["red", "green", "blue"]}),
    ("enum_mixed", {"enum": [1, "two", None, True, 3.5]}),
    ("const", {"const": "fixed"}),
    ("const_object", _obj({"kind": {"const": "point"}, "x": {"type": "integer"}})),
    ("any_of", {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer"}]}),
    ("one_of_tagged", {"oneOf": [_obj({"kind": {"const": "circle"}, "r": {"type": "number"}}),
                                 _obj({"kind": {"const": "square"}, "side": {"type": "number"}})]}),
    ("all_of", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                          {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}),
    ("int_range", {"type": "integer", "minimum": -5, "maximum": 5}),
    ("int_exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}),
    ("number_range", {"type": "number", "minimum": 0, "maximum": 1}),
    ("multiple_of", {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}),
    ("string_lengths", {"type": "string", "minLength": 3, "maxLength": 6}),
    ("pattern_code", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}),
    ("pattern_words", {"type": "string", "pattern": "^(yes|no|maybe)$"}),
    ("date", {"type": "string", "format": "date"}),
    ("time", {"type": "string", "format": "time"}),
    ("date_time", {"type": "string", "format": "date-time"}),
    ("uuid", {"type": "string", "format": "uuid"}),
    ("email", {"type": "string", "format": "email"}),
    ("event", _obj({"title": NAME, "day": {"type": "string", "format": "date"},
                    "start": {"type": "string", "format": "time"},
                    "id": {"type": "string", "format": "uuid"}})),
    ("array_ints", {"type": "array", "items": {"type": "integer"}, "maxItems": 8}),
    ("array_bounded", {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2,
                       "maxItems": 3}),
    ("array_empty_ok", {"type": "array", "items": {"type": "boolean"}, "maxItems": 0}),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 10}, {"type": "integer"},
                                                {"type": "boolean"}], "items": False}),
    ("tuple_rest", {"type": "array", "prefixItems": [{"const": "head"}], "items": {"type": "integer"},
                    "maxItems": 4}),
    ("array_of_objects", {"type": "array", "items": _obj({"name": NAME, "qty": {"type": "integer",
                                                                                 "minimum": 1}}),
                          "minItems": 1, "maxItems": 3}),
    ("nested", _obj({"user": _obj({"name": NAME, "address": _obj({"city": NAME, "zip": {
        "type": "string", "pattern": "^[0-9]{5}$"}})}), "active": {"type": "boolean"}})),
    ("deep_nested", _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "integer"}})})})})),
    ("ref_defs", {"$defs": {"point": _obj({"x": {"type": "integer"}, "y": {"type": "integer"}})},
                  "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                                   "to": {"$ref": "#/$defs/point"}},
                  "required": ["from", "to"], "additionalProperties": False}),
    ("ref_definitions", {"definitions": {"color": {"enum": ["red", "blue"]}},
                         "type": "array", "items": {"$ref": "#/definitions/color"}, "maxItems": 4}),
    ("recursive_tree", {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/node"}),
    ("recursive_list", {"$defs": {"cell": {"type": "object", "properties": {
        "head": {"type": "string", "maxLength": 8}, "tail": {"anyOf": [{"$ref": "#/$defs/cell"},
                                                                     {"type": "null"}]}},
        "required": ["head", "tail"], "additionalProperties": False}}, "$ref": "#/$defs/cell"}),
    ("root_ref_recursion", {"type": "object", "properties": {"name": NAME, "parent": {
        "anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["name"], "additionalProperties": False}),
    ("nullable_field", _obj({"note": {"type": ["string", "null"], "maxLength": 20}})),
    ("enum_in_array", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 5}),
    ("matrix", {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                "maxItems": 3}),
    ("inventory", _obj({"items": {"type": "array", "items": _obj({
        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}, "price": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}),
        "maxItems": 3}, "total": {"type": "number"}})),
    ("pattern_properties", {"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
                            "additionalProperties": False, "maxProperties": 3}),
    ("min_properties", {"type": "object", "additionalProperties": {"type": "boolean"},
                        "minProperties": 1, "maxProperties": 2}),
    ("description_only", {"description": "anything at all"}),
    ("true_schema", True),
    ("mixed_enum_object", _obj({"status": {"enum": ["ok", "error"]},
                                "code": {"type": "integer", "minimum": 100, "maximum": 599},
                                "message": {"type": "string", "maxLength": 30}})),
]


# Generated: one object per (value schema, array bound) pair, so every type appears nested in
# objects and arrays of objects too.
VALUES: list[tuple[str, Any]] = [
    ("str", {"type": "string", "maxLength": 16}), ("int", AGE), ("bool", {"type": "boolean"}),
    ("enum", {"enum": ["low", "mid", "high"]}), ("date", {"type": "string", "format": "date"}),
    ("uuid", {"type": "string", "format": "uuid"}),
]
GENERATED: list[tuple[str, Schema]] = []
for value_name, value in VALUES:
    GENERATED.append((f"record_{value_name}", _obj({"key": NAME, "value": value})))
    GENERATED.append((f"list_of_{value_name}", {"type": "array", "items": _obj({"v": value}),
                                                "minItems": 1, "maxItems": 2}))

SCHEMAS: list[tuple[str, Schema]] = HAND + GENERATED

# Keywords llguidance cannot enforce: each must be a 400 that names it.
UNSUPPORTED: list[tuple[str, Schema]] = [
    ("uniqueItems", {"type": "array", "uniqueItems": True}),
    ("contains", {"type": "array", "contains": {"type": "integer"}}),
    ("not", {"not": {"type": "string"}}),
    ("if", {"if": {"type": "string"}, "then": {"minLength": 2}}),
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}}),
    ("dependentSchemas", {"type": "object", "dependentSchemas": {"a": {}}}),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 3}}),
    ("unevaluatedProperties", {"type": "object", "unevaluatedProperties": False}),
    ("unevaluatedItems", {"type": "array", "unevaluatedItems": False}),
    ("dependencies", {"type": "object", "dependencies": {"a": ["b"]}}),
    ("$dynamicRef", {"$dynamicRef": "#x"}),
    ("bogus-format", {"type": "string", "format": "bogus-format"}),
    ("look-around", {"type": "string", "pattern": "(?=a)a"}),
]
