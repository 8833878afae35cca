"""Structured output through `ember serve` (stories260K on loopback): response_format
json_object / json_schema with the official openai client, llama-server's json_schema and
grammar fields, and a 400 naming the field and keyword for everything that cannot be enforced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from schema_corpus import UNSUPPORTED
from server_support import RunningServer, serving

from ember.grammar import JsonBounds
from ember.server.config import ServerConfig

# Small enough for stories260K to finish within max_tokens.
SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(stories_path), parallel=4, threads=1, ctx_size=512,
                              aliases=["stories"])) as running:
        yield running



def post(server: RunningServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url.removesuffix("/v1") + path, json=body, timeout=120)


def test_chat_json_schema(client: openai.OpenAI) -> None:
    n_stop = 0
    for seed in range(6):
        out = client.chat.completions.create(
            model="stories", messages=[{"role": "user", "content": "Who are you?"}], max_tokens=80,
            temperature=0.9, seed=seed,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "small", "schema": SMALL, "strict": True}})
        choice = out.choices[0]
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            n_stop += 1
            jsonschema.validate(json.loads(choice.message.content), SMALL)
    assert n_stop >= 1


def test_chat_json_object_streamed(client: openai.OpenAI) -> None:
    for seed in range(4):
        chunks = list(client.chat.completions.create(
            model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=60, temperature=0.8,
            seed=seed, response_format={"type": "json_object"}, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = chunks[-1].choices[0].finish_reason
        assert text.startswith("{")
        if reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_completions_response_format(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    out = client.completions.create(
        model="stories", prompt="Once upon a time", max_tokens=40, temperature=0,
        extra_body={"response_format": fmt})
    assert out.choices[0].finish_reason == "stop"
    assert json.loads(out.choices[0].text) in ({"ok": True}, {"ok": False})


def test_llama_server_fields(server: RunningServer) -> None:
    schema = {"enum": ["alpha", "beta"]}
    r = post(server, "/v1/completions", {"prompt": "Once", "max_tokens": 20, "temperature": 0,
                                         "json_schema": schema})
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["text"]) in ("alpha", "beta")
    r = post(server, "/v1/completions", {"prompt": "Once", "max_tokens": 20, "temperature": 0,
                                         "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")
    assert r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("keyword", [k for k, _ in UNSUPPORTED])
def test_unsupported_keyword_is_a_400_naming_it(server: RunningServer, keyword: str) -> None:
    schema = dict(UNSUPPORTED)[keyword]
    body = {"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert keyword.split("-")[0] in error["message"]
    assert error["param"] == "response_format.json_schema.schema"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
     "response_format.json_schema.schema"),
    ({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}, "grammar"),
    ({"grammar": 5}, "grammar"),
    ({"grammar": "root ::= (unclosed"}, "grammar"),
    ({"json_schema": {"type": "array", "contains": {}}}, "json_schema"),
])
def test_bad_constraint_fields_are_400s(server: RunningServer, body: dict, param: str) -> None:
    r = post(server, "/v1/completions", {"prompt": "x", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_json_bounds_flags_bound_every_json_constraint(stories_path: Path) -> None:
    """--json-int-digits 2 --json-indent -1: every JSON answer (response_format, llama-server's
    json_schema, vLLM's guided_json) is compact, its unbounded integers within two digits;
    a schema's own maximum still widens its field."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "wide": {
        "type": "integer", "minimum": 100000, "maximum": 999999}}, "required": ["n", "wide"],
        "additionalProperties": False}
    bodies = [{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
              {"json_schema": schema}, {"guided_json": schema}]
    config = ServerConfig(model=str(stories_path), parallel=3, threads=1, ctx_size=256,
                          json_bounds=JsonBounds(int_digits=2, indent=-1))
    with serving(config) as running:
        for i, extra in enumerate(bodies * 2):
            r = post(running, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Numbers"}], "max_tokens": 60,
                "temperature": 1.5, "seed": i, **extra})
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["message"]["content"]
            assert not any(c in text for c in " \n\t"), text
            if r.json()["choices"][0]["finish_reason"] == "stop":
                value = json.loads(text)
                jsonschema.validate(value, schema)
                assert -99 <= value["n"] <= 99, text
            else:
                assert len(text.split(",")[0].removeprefix('{"n":').lstrip("-")) <= 2, text
