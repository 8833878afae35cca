"""The bounds of JSON constraints (ember.grammar.JsonBounds), without a model: walks
through the grammar on stories260K's vocabulary by an adversary that writes digits and
whitespace whenever it may (the loops a weak model falls into) must keep every number and
every run of whitespace within the bounds, and finish where the schema leaves nothing else to
write; random walks on schemas with bounding keywords give values that obey them."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from schema_corpus import KIND, SCHEMAS

from ember import _core
from ember.grammar import BOUNDS, Constraint, ConstraintError, GrammarCompiler, JsonBounds


def allowed(state: _core.GrammarState, n_vocab: int) -> list[int]:
    mask = state.mask(n_vocab)
    return [t for t in range(n_vocab) if (mask[t >> 5] >> (t & 31)) & 1]


def walk(grammar: _core.Grammar, tokenizer: _core.Tokenizer, rng: random.Random, steps: int,
         adversary: bool) -> tuple[str, bool]:
    """(text, finished). The adversary takes a digit or whitespace token whenever one is allowed
    and never ends early; otherwise tokens are random and end-of-generation is taken when allowed
    after a few steps."""
    n = tokenizer.n_vocab
    state, text = grammar.start(), b""
    for step in range(steps):
        tokens = allowed(state, n)
        assert tokens, text
        eog = [t for t in tokens if tokenizer.is_eog(t)]
        rest = [t for t in tokens if not tokenizer.is_eog(t)]
        if adversary:
            spin = [t for t in rest if re.fullmatch(rb"[0-9 \n\t]+", tokenizer.token_to_piece(t, False))]
            choice = rng.choice(spin) if spin else rng.choice(rest) if rest else eog[0]
        else:
            choice = eog[0] if eog and (step > 8 or not rest) else rng.choice(rest)
        if tokenizer.is_eog(choice):
            return text.decode(), True
        assert state.advance(choice), state.error
        text += tokenizer.token_to_piece(choice, False)
    return text.decode("utf-8", "replace"), False


def assert_bounded(text: str, bounds: JsonBounds) -> None:
    """Outside strings: no number longer than the bounds, no exponent, no whitespace run over
    a line break and `bounds.indent` indentation characters (none at all when compact)."""
    outside = re.sub(r'"(\\.|[^"\\])*("|$)', '""', text)
    for number in re.findall(r"-?[0-9][0-9.eE+-]*", outside):
        whole, _, frac = number.lstrip("-").partition(".")
        assert len(whole) <= bounds.int_digits and len(frac) <= bounds.frac_digits, number
        assert "e" not in number.lower(), number
    for space in re.findall(r"[ \t\r\n]+", outside):
        assert bounds.indent >= 0, repr(space)
        assert space == " " or re.fullmatch(rf"\r?\n[ \t]{{0,{bounds.indent}}}", space), repr(space)


NUMERIC = [{"type": "integer"}, {"type": "number"}, {"type": ["integer", "null"]},
           {"type": "integer", "minimum": 0}, {"type": "number", "maximum": 3}]


@pytest.mark.parametrize("case", range(len(NUMERIC)))
def test_a_digit_spinning_walk_finishes_within_the_bounds(case: int, tokenizer: _core.Tokenizer,
                                                          compiler: GrammarCompiler) -> None:
    """Unbounded, the adversary writes "1111..." forever; bounded, the number must end."""
    grammar = compiler.compile(Constraint.json_schema(NUMERIC[case]))
    for seed in range(3):
        text, finished = walk(grammar, tokenizer, random.Random(seed), 80, adversary=True)
        assert finished, text
        assert_bounded(text, BOUNDS)
        jsonschema.validate(json.loads(text), NUMERIC[case])


@pytest.mark.parametrize("indent", [0, 3, -1])
def test_the_whitespace_bound_is_the_one_asked_for(indent: int, tokenizer: _core.Tokenizer,
                                                   compiler: GrammarCompiler) -> None:
    """JsonBounds.indent narrows (3), forbids indentation (0) or all whitespace (-1, compact):
    the whitespace-spinning adversary never writes more, and finishes a two-key object."""
    bounds = JsonBounds(indent=indent)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    grammar = compiler.compile(Constraint.json_schema(schema).with_bounds(bounds))
    spaces = []
    for seed in range(3):
        text, finished = walk(grammar, tokenizer, random.Random(seed), 80, adversary=True)
        assert finished, text
        assert_bounded(text, bounds)
        jsonschema.validate(json.loads(text), schema)
        spaces += re.findall(r"[ \t\r\n]+", text)
    assert (spaces == []) == (indent < 0), spaces  # the adversary writes what it may
    if indent > 0:
        assert max(len(s.lstrip("\r\n")) for s in spaces) == indent, spaces


def test_bounds_outside_their_range_are_refused() -> None:
    for bad in ({"indent": -2}, {"indent": 257}, {"int_digits": 0}, {"frac_digits": 11}):
        with pytest.raises(ConstraintError, match=next(iter(bad))):
            JsonBounds(**bad)


OPEN = [{"type": "object"}, {}, True, {"type": "array"}, {"type": "array", "items": {"type": "number"}},
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
         "required": ["a", "b"]}]


@pytest.mark.parametrize("case", range(len(OPEN)))
def test_open_schemas_keep_numbers_and_whitespace_bounded(case: int, tokenizer: _core.Tokenizer,
                                                          compiler: GrammarCompiler) -> None:
    """Any-value places ({}, an object's unlisted properties, an array's items) too: llguidance's
    own any-value has unbounded numbers."""
    grammar = compiler.compile(Constraint.json_schema(OPEN[case]))
    for seed in range(4):
        for adversary in (True, False):
            text, finished = walk(grammar, tokenizer, random.Random(seed), 120, adversary)
            assert_bounded(text, BOUNDS)
            if finished:
                jsonschema.validate(json.loads(text), OPEN[case])


def test_corpus_walks_stay_bounded_and_valid(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    """Every schema of the corpus, random walks: finished ones validate, all stay bounded."""
    n_finished = 0
    for i, (name, schema) in enumerate(SCHEMAS):
        grammar = compiler.compile(Constraint.json_schema(schema))
        text, finished = walk(grammar, tokenizer, random.Random(i), 60, adversary=False)
        assert_bounded(text, BOUNDS)
        if finished:
            n_finished += 1
            try:
                jsonschema.validate(json.loads(text), schema)
            except (json.JSONDecodeError, jsonschema.ValidationError) as err:
                pytest.fail(f"{name} ({KIND[name]}): {text!r}: {err}")
    assert n_finished >= len(SCHEMAS) // 3


KEYWORDS = {"type": "object", "properties": {
    "code": {"type": "string", "maxLength": 4}, "name": {"type": "string", "minLength": 2, "maxLength": 5},
    "n": {"type": "integer", "minimum": -3, "maximum": 7}, "x": {"type": "number", "exclusiveMinimum": 0,
                                                                  "maximum": 2.5},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
    "zip": {"type": "string", "pattern": "^[0-9]{3}-[a-z]{2}$"}, "day": {"type": "string", "format": "date"},
    "id": {"type": "string", "format": "uuid"}},
    "required": ["code", "name", "n", "x", "tags", "zip", "day", "id"], "additionalProperties": False}


def test_bounding_keywords_are_obeyed(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    """maxLength, minLength, minimum/maximum (exclusive too), minItems/maxItems, pattern and
    format: random walks that finish give values jsonschema accepts, format included."""
    grammar = compiler.compile(Constraint.json_schema(KEYWORDS))
    checker = jsonschema.Draft202012Validator(KEYWORDS, format_checker=jsonschema.FormatChecker())
    n_finished = 0
    for seed in range(12):
        text, finished = walk(grammar, tokenizer, random.Random(seed), 400, adversary=False)
        assert_bounded(text, BOUNDS)
        if finished:
            n_finished += 1
            value = json.loads(text)
            assert not list(checker.iter_errors(value)), text
            assert len(value["code"]) <= 4 and -3 <= value["n"] <= 7 and len(value["tags"]) <= 2
    assert n_finished >= 8


def accepts(compiler: GrammarCompiler, tokenizer: _core.Tokenizer, schema: object, text: str) -> bool:
    """Whether the grammar takes `text`, fed one character's token at a time."""
    single = {}
    for t in range(tokenizer.n_vocab):
        piece = tokenizer.token_to_piece(t, False)
        if len(piece) == 1 and not tokenizer.is_eog(t):
            single.setdefault(piece.decode("latin-1"), t)
    state = compiler.compile(Constraint.json_schema(schema)).start()
    for token in (single[c] for c in text):
        if token not in allowed(state, tokenizer.n_vocab) or not state.advance(token):
            return False
    return state.is_accepting


def test_the_bounds_exactly(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    def ok(schema: object, text: str) -> bool:
        return accepts(compiler, tokenizer, schema, text)

    assert ok({"type": "integer"}, "9" * 16) and not ok({"type": "integer"}, "9" * 17)
    assert ok({"type": "integer"}, "-" + "9" * 16) and not ok({"type": "integer"}, "-" + "1" * 17)
    assert ok({"type": "number"}, "0." + "5" * 10) and not ok({"type": "number"}, "0." + "5" * 11)
    assert ok({"type": "number"}, "-12.25") and not ok({"type": "number"}, "1e5")
    assert not ok({"type": "object"}, '{"a": [' + "1" * 17 + "]}")
    assert ok({"type": "object"}, '{"a": [1.5, {"b": null}]}')
    assert ok({"type": "object"}, '{\n  "a": 1\n}')
    assert not ok({"type": "object"}, '{\n' + " " * 21 + '"a": 1}')


def test_a_schema_widens_its_own_numbers(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    """minimum/maximum/multipleOf in the schema replace the default bound on that side."""
    wide = {"type": "integer", "minimum": 0, "maximum": 10 ** 17}
    assert accepts(compiler, tokenizer, wide, "1" * 17)
    assert not accepts(compiler, tokenizer, {"type": "integer", "minimum": 0}, "1" * 17)
    assert accepts(compiler, tokenizer, {"type": "number", "multipleOf": 0.25}, "3.75")
    assert not accepts(compiler, tokenizer, {"type": "number", "multipleOf": 0.25}, "3.7")
    time = {"type": "string", "format": "time"}  # 24 characters: 9 second-fraction digits and "+01:00"
    assert accepts(compiler, tokenizer, time, '"12:00:00.123456789+01:00"')
    assert not accepts(compiler, tokenizer, time, '"12:00:00.' + "8" * 16 + 'Z"')
    assert accepts(compiler, tokenizer, {**time, "maxLength": 40}, '"12:00:00.' + "8" * 16 + 'Z"')
    tiny = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-12}  # finer than the step
    assert accepts(compiler, tokenizer, tiny, "0.0000000000001")


def test_other_bounds(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    narrow = JsonBounds(int_digits=3, frac_digits=0)
    constraint = Constraint.json_schema({"type": "number"}).with_bounds(narrow)
    grammar = compiler.compile(constraint)
    text, finished = walk(grammar, tokenizer, random.Random(0), 40, adversary=True)
    assert finished and len(text.lstrip("-")) <= 3 and "." not in text, text
    with pytest.raises(ConstraintError, match="frac_digits"):
        JsonBounds(frac_digits=11)
