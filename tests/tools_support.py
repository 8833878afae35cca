"""Tools that the tool-calling tests offer (no tests here), in OpenAI's chat shape."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a timezone",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "enum": ["UTC", "CET", "PST"]},
        "seconds": {"type": "boolean"}}, "required": ["timezone", "seconds"],
        "additionalProperties": False}}}
