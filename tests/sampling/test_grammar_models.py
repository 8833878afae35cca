"""Constrained generation on real models: over the schema corpus (tests/schema_corpus.py) with
SmolLM2 and stories260K, greedy and sampled, every response that finishes with `stop` is JSON
that validates against its schema; json_object gives one JSON object; unconstrained requests in
the same batch generate exactly what they generate alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from schema_corpus import SCHEMAS

import ember
from ember.grammar import Constraint, lark_json
from ember.results import GenerationResult
from ember.sampling import SamplingParams

MAX_TOKENS = 96


@pytest.fixture(scope="module")
def stories(stories_path: Path) -> Iterator[ember.LLM]:
    llm = ember.LLM(str(stories_path), parallel=16, n_ctx=512)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[ember.LLM]:
    llm = ember.LLM(str(smollm2_path), parallel=16, n_ctx=1024)
    yield llm
    llm.close()


def run_corpus(llm: ember.LLM, prompts: list[list[int]], temperature: float) -> list[GenerationResult]:
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=MAX_TOKENS,
                             constraint=Constraint.json_schema(schema))
              for i, (_name, schema) in enumerate(SCHEMAS)]
    return llm.engine.generate_batch(prompts, params)


def check_valid(results: list[GenerationResult]) -> int:
    """Asserts every `stop` result validates; returns how many stopped."""
    n_stop = 0
    for (name, schema), result in zip(SCHEMAS, results):
        assert result.finish_reason in ("stop", "length"), (name, result.finish_reason)
        if result.finish_reason == "stop":
            n_stop += 1
            try:
                jsonschema.validate(json.loads(result.text), schema)
            except (json.JSONDecodeError, jsonschema.ValidationError) as err:
                pytest.fail(f"schema {name}: {result.text!r} is not valid: {err}")
    return n_stop


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_corpus_smollm2(smollm2: ember.LLM, temperature: float) -> None:
    prompts = [smollm2.tokenize_chat([{"role": "user", "content": "Answer with JSON matching this "
                                       f"schema: {json.dumps(schema)}"}]) for _, schema in SCHEMAS]
    n_stop = check_valid(run_corpus(smollm2, prompts, temperature))
    assert n_stop >= 60  # 69 and 75 of 92 when written; the rest reach max_tokens


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_corpus_stories(stories: ember.LLM, temperature: float) -> None:
    prompt = stories.tokenize("Once upon a time")
    n_stop = check_valid(run_corpus(stories, [prompt] * len(SCHEMAS), temperature))
    assert n_stop >= 50  # 61 and 62 of 92 when written: a 260K-parameter story model


def test_json_object_is_one_object(smollm2: ember.LLM) -> None:
    questions = ["Describe a cat.", "List three fruits.", "What is 2 + 2?", "Give me a user record.",
                 "Say hello."]
    n_stop = 0
    for i, question in enumerate(questions):
        for temperature in (0.0, 1.0):
            result = smollm2.chat([{"role": "user", "content": question}], max_tokens=MAX_TOKENS,
                                  temperature=temperature, seed=i, json_schema={"type": "object"})
            assert result.text.lstrip().startswith("{"), result.text
            if result.finish_reason == "stop":
                n_stop += 1
                assert isinstance(json.loads(result.text), dict), result.text
    assert n_stop >= 5


def test_gbnf_grammar(stories: ember.LLM) -> None:
    grammar = 'root ::= "The " ("cat" | "dog" | "bird") " is " [a-z]+ "."'
    for seed in range(4):
        result = stories.generate("Once upon a time", grammar=grammar, temperature=1.0, seed=seed,
                                  max_tokens=40)
        if result.finish_reason == "stop":
            assert result.text.startswith("The ") and result.text.endswith("."), result.text
        else:
            assert result.text.startswith("The ")


def test_unconstrained_requests_in_the_batch_are_unaffected(stories: ember.LLM) -> None:
    """The same unconstrained greedy request alone and amid constrained ones: the same tokens."""
    prompt = stories.tokenize("Once upon a time")
    plain = SamplingParams(temperature=0.0, max_tokens=48)
    alone = stories.engine.generate(prompt, plain).tokens
    constrained = [SamplingParams(temperature=0.7, seed=i, max_tokens=48,
                                  constraint=Constraint.json_schema(schema))
                   for i, (_, schema) in enumerate(SCHEMAS[:6])]
    together = stories.engine.generate_batch([prompt] * 7, [plain, *constrained])
    assert together[0].tokens == alone
    assert together[1].tokens != alone


def test_constraints_survive_preemption(stories_path: Path) -> None:
    """A KV cache too small for every request preempts some (they recompute their tokens later):
    each constraint still advances once per output token, so every stopped output validates."""
    llm = ember.LLM(str(stories_path), parallel=8, n_ctx=256, kv_size=320)
    try:
        prompt = llm.tokenize("Once upon a time")
        schemas = SCHEMAS[:16]
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=120,
                                 constraint=Constraint.json_schema(schema))
                  for i, (_, schema) in enumerate(schemas)]
        results = llm.engine.generate_batch([prompt] * len(schemas), params)
        assert llm.engine.stats().preemptions > 0
    finally:
        llm.close()
    n_stop = 0
    for (_name, schema), result in zip(schemas, results):
        if result.finish_reason == "stop":
            n_stop += 1
            jsonschema.validate(json.loads(result.text), schema)
    assert n_stop >= 4


def test_lark_with_an_embedded_json_schema(smollm2: ember.LLM) -> None:
    """The form a tool call takes: fixed text around a JSON value that matches a schema."""
    call = {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False}
    grammar = 'start: "<tool_call>" call "</tool_call>"\ncall: ' + lark_json(call)
    result = smollm2.chat([{"role": "user", "content": "What is the weather in Paris?"}],
                          constraint=Constraint.lark(grammar), temperature=0, max_tokens=60)
    assert result.finish_reason == "stop"
    assert result.text.startswith("<tool_call>") and result.text.endswith("</tool_call>")
    body = result.text.removeprefix("<tool_call>").removesuffix("</tool_call>")
    jsonschema.validate(json.loads(body), call)
