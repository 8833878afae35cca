"""JSON schemas for the structured-output tests, from tests/data/structured/schemas.json: the
kinds real APIs send (nested objects, arrays of objects, enums, anyOf, $ref/$defs, recursive
trees and lists, optional fields, formats, open objects) and every type and keyword ember
enforces, many with no bounds at all. SCHEMAS holds (name, schema) pairs, KIND each one's kind;
UNSUPPORTED the keywords that must be refused with a 400 naming them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Schema = dict[str, Any]

CORPUS = Path(__file__).resolve().parent / "data" / "structured" / "schemas.json"
_ENTRIES = json.loads(CORPUS.read_text())
SCHEMAS: list[tuple[str, Schema]] = [(e["name"], e["schema"]) for e in _ENTRIES]
KIND: dict[str, str] = {e["name"]: e["kind"] for e in _ENTRIES}

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
