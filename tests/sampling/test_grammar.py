"""Grammar-constrained sampling without a model: masks against a brute-force check on
stories260K's 512-token vocabulary, the sampler honouring the mask in every sampling mode, the
compile cache, and schema keywords that must be refused."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import regex
from schema_corpus import SCHEMAS, UNSUPPORTED

from ember import _core
from ember.grammar import Constraint, ConstraintError, GrammarCompiler


def allowed(mask: np.ndarray, n_vocab: int) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:n_vocab]
    return set(np.flatnonzero(bits).tolist())


# (constraint, the same language as a regex for the brute-force check). Finite or not, the
# regex module's partial matching says whether a text can still become a full match.
LANGUAGES = [
    (Constraint.gbnf('root ::= "{\\"a\\":" ("true" | "false") ",\\"b\\":" ("1" | "22" | "333") "}"'),
     r'\{"a":(true|false),"b":(1|22|333)\}'),
    (Constraint.gbnf('root ::= item ("," item)*\nitem ::= [a-c]+ | "once" | " upon"'),
     r"([a-c]+|once| upon)(,([a-c]+|once| upon))*"),
    (Constraint.regex(r"[0-9]{1,3}(\.[0-9]{2})? (cats|dogs)"), r"[0-9]{1,3}(\.[0-9]{2})? (cats|dogs)"),
    (Constraint.lark('start: "Once" " upon"? " a time" | "The end"'), r"Once( upon)? a time|The end"),
]


@pytest.mark.parametrize("case", range(len(LANGUAGES)))
def test_mask_matches_brute_force(case: int, tokenizer: _core.Tokenizer,
                                  compiler: GrammarCompiler) -> None:
    """On random walks through the grammar, the mask allows exactly the tokens whose bytes keep
    the text a prefix of the language, and EOS exactly where the text is in it."""
    constraint, pattern = LANGUAGES[case]
    language = regex.compile(pattern)
    n = tokenizer.n_vocab
    pieces = [tokenizer.token_to_piece(t, False) for t in range(n)]
    grammar = compiler.compile(constraint)
    rng = random.Random(case)
    n_checked = 0
    for _walk in range(6):
        state, text = grammar.start(), b""
        for _step in range(40):
            got = allowed(state.mask(n), n)
            complete = language.fullmatch(text.decode("utf-8", "replace")) is not None
            expected = set()
            for t in range(n):
                if tokenizer.is_eog(t):
                    if complete:
                        expected.add(t)
                elif pieces[t]:
                    candidate = text + pieces[t]
                    try:
                        s = candidate.decode("utf-8")
                    except UnicodeDecodeError:
                        continue  # byte tokens of a multi-byte character: no language here has one
                    if language.fullmatch(s, partial=True) is not None:
                        expected.add(t)
            assert got == expected, (text, sorted(got ^ expected)[:10])
            assert state.is_accepting == complete
            n_checked += 1
            token = rng.choice(sorted(got))
            if tokenizer.is_eog(token):
                break
            assert state.advance(token), state.error
            text += pieces[token]
    assert n_checked >= 12


def test_rejected_token_is_an_error(tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    state = compiler.compile(Constraint.regex("ab")).start()
    bad = next(t for t in range(tokenizer.n_vocab) if tokenizer.token_to_piece(t, False) == b"z")
    assert not state.advance(bad)
    assert state.error


MODES = [
    {"temperature": 0.0},
    {"temperature": 0.0, "repeat_penalty": 1.3, "presence_penalty": 0.5},
    {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.5, "top_p": 0.5, "min_p": 0.1},
    {"temperature": 1.0, "typical_p": 0.5, "frequency_penalty": 1.0},
]


@pytest.mark.parametrize("mode", range(len(MODES)))
def test_sampler_only_picks_allowed_tokens(mode: int, tokenizer: _core.Tokenizer,
                                           compiler: GrammarCompiler) -> None:
    """Whatever the sampling mode, and even with a +100 logit bias on forbidden tokens, every
    sample is allowed; distribution() holds allowed tokens only."""
    n = tokenizer.n_vocab
    grammar = compiler.compile(Constraint.json_schema(dict(SCHEMAS)["person"]))
    rng = np.random.default_rng(mode)
    probe = grammar.start()
    first = allowed(probe.mask(n), n)
    forbidden = [t for t in range(n) if t not in first][:20]
    params = _core.SamplingParams(**MODES[mode], seed=mode,
                                  logit_bias=[(t, 100.0) for t in forbidden])
    sampler = _core.Sampler(params, n, grammar)
    shadow = grammar.start()  # the same walk, to read each step's mask
    for _ in range(60):
        mask = allowed(shadow.mask(n), n)
        logits = rng.normal(size=n).astype(np.float32) * 4
        ids, probs = sampler.distribution(logits)
        assert set(ids.tolist()) <= mask and len(ids) > 0
        token = sampler.sample(logits)
        assert token in mask
        sampler.accept(token)
        assert sampler.advance(token)
        assert shadow.advance(token)
        if tokenizer.is_eog(token):
            break


def test_greedy_picks_the_best_allowed_token(tokenizer: _core.Tokenizer,
                                             compiler: GrammarCompiler) -> None:
    n = tokenizer.n_vocab
    grammar = compiler.compile(Constraint.regex("(cat|dog)s?"))
    mask = allowed(grammar.start().mask(n), n)
    logits = np.random.default_rng(0).normal(size=n).astype(np.float32)
    expected = max(mask, key=lambda t: logits[t])
    logits[min(set(range(n)) - mask)] = 50.0  # the unconstrained argmax is forbidden
    assert _core.Sampler(_core.SamplingParams(temperature=0.0), n, grammar).sample(logits) == expected


def test_compiled_grammars_are_cached(compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"cached": {"type": "integer"}}}
    before = compiler.n_compiled
    compiler.compile(Constraint.json_schema(schema))
    assert compiler.n_compiled == before + 1
    compiler.compile(Constraint.json_schema(json.dumps(schema)))  # the same schema as text
    assert compiler.n_compiled == before + 1


def test_corpus_compiles(compiler: GrammarCompiler) -> None:
    assert len(SCHEMAS) >= 60
    for _name, schema in SCHEMAS:
        compiler.compile(Constraint.json_schema(schema))


@pytest.mark.parametrize("keyword", [k for k, _ in UNSUPPORTED])
def test_unsupported_keyword_is_refused_by_name(keyword: str, compiler: GrammarCompiler) -> None:
    schema = dict(UNSUPPORTED)[keyword]
    with pytest.raises(ConstraintError, match=regex.escape(keyword.split("-")[0])):
        compiler.compile(Constraint.json_schema(schema))


def test_bad_grammars_are_clear_errors(compiler: GrammarCompiler) -> None:
    with pytest.raises(ConstraintError, match="GBNF"):
        compiler.compile(Constraint.gbnf("root ::= (unclosed"))
    with pytest.raises(ConstraintError, match="not valid JSON"):
        Constraint.json_schema("{not json")
    with pytest.raises(ConstraintError, match="reserved"):
        compiler.compile(Constraint.json_schema({"x-guidance": {}}))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_gives_way_to_a_grammar_that_allows_only_stop_tokens(
        temperature: float, tokenizer: _core.Tokenizer, compiler: GrammarCompiler) -> None:
    """Once the output is complete only end-of-generation tokens are allowed: min_tokens holds
    them back only while something else is allowed, so the sampler still ends the output."""
    n = tokenizer.n_vocab
    eog = [t for t in range(n) if tokenizer.is_eog(t)]
    sampler = _core.Sampler(_core.SamplingParams(temperature=temperature, min_tokens=50, seed=3),
                            n, compiler.compile(Constraint.regex("cat")), stop_ids=eog)
    rng = np.random.default_rng(0)
    out: list[int] = []
    while len(out) < 10 and (not out or out[-1] not in eog):
        out.append(sampler.sample(rng.normal(size=n).astype(np.float32)))
        if out[-1] not in eog:
            assert sampler.advance(out[-1])
    assert out[-1] in eog and tokenizer.decode(out[:-1], True) == "cat"
