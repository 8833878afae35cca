"""Speculative decoding on real models: the output never changes.

Greedy output with speculation equals greedy output without it, token for token, on stories260K
and SmolLM2, for every draft source (prompt lookup, a prediction, a draft model), for a request
alone and among 15 others, with preemption, penalties, logit_bias, stop strings and logprobs.
Every source here is given drafts it gets partly wrong (an edited prediction, a draft model with
perturbed weights), so both acceptance and rollback run. With sampling, the distribution of the
tokens at fixed positions is the same as without speculation (a chi-square homogeneity test).
"""

from __future__ import annotations

import math
import shutil
import time
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

from ember.engine import Engine
from ember.sampling import SamplingParams

STORIES = Path(__file__).resolve().parent.parent / "data" / "stories260K.gguf"
STORY_PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben", "One day, a cat",
                 "Tom had a red ball", "The sun was hot", "Sara liked to", "A big bird",
                 "Max was sad because", "In the park", "The girl said", "There was a boy",
                 "Mom made a cake", "The tree was", "Tim and his dad", "It was raining"]


def perturbed_copy(src: Path, dst: Path, seed: int = 0) -> Path:
    """A copy of `src` whose layer weights are changed a little: a draft model with the same
    vocabulary that agrees with the original often, not always. f32 tensors get relative noise,
    Q4_1 tensors noise on their block scales."""
    shutil.copyfile(src, dst)
    reader = gguf.GGUFReader(dst, "r+")
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        if not t.name.startswith("blk."):
            continue
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            values = t.data.reshape(-1)
            values *= (1 + 0.3 * rng.standard_normal(values.shape)).astype(np.float32)
        elif t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            blocks = t.data.reshape(-1, 20)  # f16 d, f16 m, 16 bytes of nibbles
            scales = blocks[:, 0:2].copy().view(np.float16)
            scales *= (1 + 0.02 * rng.standard_normal(scales.shape)).astype(np.float16)
            blocks[:, 0:2] = scales.view(np.uint8)
    del reader
    return dst


@pytest.fixture(scope="module")
def stories_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(STORIES, tmp_path_factory.mktemp("draft") / "stories-draft.gguf")


def idle_stats(engine: Engine):
    """The engine's stats once it has published its last step (a result arrives just before)."""
    for _ in range(500):
        stats = engine.stats()
        if stats.running == 0 and stats.waiting == 0:
            return stats
        time.sleep(0.01)
    raise AssertionError(f"the engine did not go idle: {stats}")


def greedy(engine: Engine, prompts: list, params: list[SamplingParams]) -> list[list[int]]:
    return [r.tokens for r in engine.generate_batch(prompts, params)]


def edited(engine: Engine, tokens: list[int]) -> str:
    """The text of `tokens` with a word changed early on and a stretch left out later: what a
    prediction of an edit looks like."""
    text = engine.tokenizer.decode(tokens)
    words = text.split(" ")
    if len(words) > 4:
        words[3] = "banana"
    if len(words) > 20:
        del words[12:15]
    return " ".join(words)


def spec_engine(path: Path, spec: str, draft: Path | None, **kw) -> Engine:
    return Engine(path, parallel=16, spec="draft" if spec == "draft" else spec,
                  draft_model=draft if spec == "draft" else None, spec_adaptive=False,
                  draft_max=6, **kw)


def check_source(path: Path, prompts: list, spec: str, draft: Path | None,
                 n_tokens: int, **engine_kw) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=n_tokens)
    with Engine(path, parallel=16, **engine_kw) as plain:
        want = greedy(plain, prompts, [params] * len(prompts))
        predictions = [edited(plain, w) for w in want]
    engine_spec = "none" if spec == "prediction" else spec

    def spec_params(i: int) -> SamplingParams:
        if spec != "prediction":
            return params
        return SamplingParams(temperature=0.0, max_tokens=n_tokens, prediction=predictions[i])

    with spec_engine(path, engine_spec, draft, **engine_kw) as engine:
        # Alone.
        assert greedy(engine, prompts[:1], [spec_params(0)]) == want[:1]
        # Among 15 others, all speculating.
        assert greedy(engine, prompts, [spec_params(i) for i in range(len(prompts))]) == want
        stats = idle_stats(engine)
    source = {"ngram": "ngram", "prediction": "prediction", "draft": "draft_model"}[spec]
    drafted, accepted = stats.drafted_tokens[source], stats.accepted_tokens[source]
    assert accepted > 0, stats
    assert drafted > accepted, stats  # some drafts were wrong: rollback ran
    if "kv_size" in engine_kw:
        assert stats.preemptions > 0, stats
    assert stats.kv_usage == 0.0


@pytest.mark.parametrize("spec", ["ngram", "prediction", "draft"])
def test_greedy_is_exact_on_stories(spec: str, stories_draft: Path) -> None:
    check_source(STORIES, STORY_PROMPTS, spec, stories_draft, 120)


@pytest.mark.parametrize("spec", ["ngram", "prediction", "draft"])
def test_greedy_is_exact_under_preemption(spec: str, stories_draft: Path) -> None:
    # 16 requests of ~125 tokens in a 768-token cache: requests are preempted mid-draft.
    check_source(STORIES, STORY_PROMPTS, spec, stories_draft, 120, kv_size=768, block_size=8)


SMOL_TASK = ("Repeat this text exactly: The quick brown fox jumps over the lazy dog. The dog "
             "sleeps in the sun all day long, and the fox runs through the green field.")


@pytest.fixture(scope="module")
def smollm2_draft(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(smollm2_path, tmp_path_factory.mktemp("draft") / "smollm2-draft.gguf")


@pytest.mark.parametrize("spec", ["ngram", "prediction", "draft"])
def test_greedy_is_exact_on_smollm2(spec: str, smollm2_path: Path, smollm2_draft: Path) -> None:
    with Engine(smollm2_path, parallel=1) as e:
        prompts = [e.chat_template.encode(e.tokenizer, [
            {"role": "user", "content": f"{SMOL_TASK} ({i})"}]) for i in range(16)]
    check_source(smollm2_path, prompts, spec, smollm2_draft, 48)


def test_penalties_bias_stops_and_logprobs_under_speculation() -> None:
    prompt = "Once upon a time"
    base = SamplingParams(temperature=0.0, max_tokens=100, repeat_penalty=1.3,
                          frequency_penalty=0.2, logit_bias={13: -2.0, 45: 1.5},
                          logprobs=True, top_logprobs=3)
    with Engine(STORIES, parallel=4) as plain:
        want = plain.generate(prompt, base)
        stop = plain.tokenizer.decode(want.tokens[40:43])
        want_stopped = plain.generate(prompt, SamplingParams(**{**base.__dict__, "stop": [stop]}))
    assert want_stopped.finish_reason == "stop"
    with Engine(STORIES, parallel=4, spec="ngram", spec_adaptive=False) as engine:
        for params in (base, SamplingParams(**{**base.__dict__, "stop": [stop]}),
                       SamplingParams(**{**base.__dict__, "prediction": want.text})):
            got = engine.generate(prompt, params)
            reference = want_stopped if params.stop else want
            assert got.tokens == reference.tokens
            assert got.text == reference.text
            # Logprobs: the same tokens and top ids; values equal to float rounding (1e-5). At
            # the avx512/amx levels every op gives a row the same bits whatever rows come with it,
            # so they are equal exactly there; the avx2 level's float matmul does not (a verified
            # draft's row is one of several rows of its sequence).
            assert [lp.token for lp in got.logprobs] == [lp.token for lp in reference.logprobs]
            assert [[t.token for t in lp.top] for lp in got.logprobs] == \
                [[t.token for t in lp.top] for lp in reference.logprobs]
            got_values = [[lp.logprob] + [t.logprob for t in lp.top] for lp in got.logprobs]
            want_values = [[lp.logprob] + [t.logprob for t in lp.top]
                           for lp in reference.logprobs]
            np.testing.assert_allclose(got_values, want_values, rtol=0, atol=1e-5)
        stats = idle_stats(engine)
    assert stats.drafted_tokens["ngram"] > 0 and stats.accepted_tokens["prediction"] > 0, stats


def test_cancel_mid_draft_frees_everything() -> None:
    with Engine(STORIES, parallel=4, spec="ngram", spec_adaptive=False) as engine:
        plain = engine.generate("Once upon a time", SamplingParams(temperature=0.0,
                                                                      max_tokens=200))
        requests = [engine.submit(engine.tokenize(p), SamplingParams(
            temperature=0.0, max_tokens=400, prediction=plain.text)) for p in STORY_PROMPTS[:4]]
        for r in requests:
            for i, _ in enumerate(r):
                if i == 3:
                    r.cancel()
                    break
        assert idle_stats(engine).kv_usage == 0.0


def _chi2_quantile(p_upper: float, k: int) -> float:
    """Upper p-quantile of chi-square with k degrees of freedom (Wilson-Hilferty)."""
    z = {1e-3: 3.0902, 1e-4: 3.7190}[p_upper]
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def test_sampling_distribution_is_unchanged() -> None:
    """600 seeded runs with a prediction (the greedy text, so many drafts are accepted and many
    rejected) against 600 without, temperature 1: at each of the first 8 output positions the
    two token histograms must pass a chi-square homogeneity test at p = 1e-4 (categories with
    fewer than 10 expected draws pooled). With 8 positions the chance of a false failure is
    below 1e-3; a rule that kept a draft whenever it was merely possible, or drew the
    correction from p without removing the draft, shifts these histograms far past it."""
    n_runs, n_pos = 600, 8
    prompt = "Once upon a time"
    sampled = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=n_pos,
                   ignore_eos=True)
    with Engine(STORIES, parallel=16) as plain:
        greedy_text = plain.generate(prompt, SamplingParams(temperature=0.0, max_tokens=40)).text
        a = [r.tokens for r in plain.generate_batch(
            [prompt] * n_runs, [SamplingParams(**sampled, seed=s) for s in range(n_runs)])]
    with Engine(STORIES, parallel=16, spec_adaptive=False) as engine:
        b = [r.tokens for r in engine.generate_batch(
            [prompt] * n_runs, [SamplingParams(**sampled, seed=10_000 + s, prediction=greedy_text)
                                for s in range(n_runs)])]
        stats = idle_stats(engine)
    drafted, accepted = stats.drafted_tokens["prediction"], stats.accepted_tokens["prediction"]
    assert accepted > n_runs and drafted - accepted > n_runs / 2, stats  # both paths ran often
    for pos in range(n_pos):
        ca, cb = Counter(t[pos] for t in a), Counter(t[pos] for t in b)
        tokens = sorted(set(ca) | set(cb), key=lambda t: -(ca[t] + cb[t]))
        big = [t for t in tokens if (ca[t] + cb[t]) / 2 >= 10]
        rows = [(ca[t], cb[t]) for t in big]
        rest = (n_runs - sum(x for x, _ in rows), n_runs - sum(y for _, y in rows))
        if sum(rest) > 0:
            rows.append(rest)
        if len(rows) < 2:
            continue
        chi2 = 0.0
        for x, y in rows:
            expected = (x + y) / 2  # equal sample sizes
            chi2 += (x - expected) ** 2 / expected + (y - expected) ** 2 / expected
        bound = _chi2_quantile(1e-4, len(rows) - 1)
        assert chi2 < bound, (pos, chi2, bound, rows)


def test_grammar_constraints_hold_under_speculation(smollm2_path: Path) -> None:
    """A json_schema-constrained request, greedy: the same JSON with speculation (ngram, and a
    prediction that breaks the schema halfway) as without; drafts the grammar forbids are
    rejected, never emitted."""
    from ember.grammar import Constraint

    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    with Engine(smollm2_path, parallel=4) as plain:
        prompt = plain.chat_template.encode(plain.tokenizer, [
            {"role": "user", "content": "Give me a JSON object for Ann, aged 31."}])
        params = SamplingParams(temperature=0.0, max_tokens=48,
                                constraint=Constraint.json_schema(schema))
        want = plain.submit(prompt, params).result()
    broken = want.text[: len(want.text) // 2] + " not json at all } ] }"
    with Engine(smollm2_path, parallel=4, spec="ngram", spec_adaptive=False) as engine:
        for p in (params, SamplingParams(**{**params.__dict__, "prediction": broken})):
            got = engine.submit(prompt, p).result()
            assert got.tokens == want.tokens
        stats = idle_stats(engine)
    assert stats.accepted_tokens["prediction"] > 0
    assert stats.drafted_tokens["prediction"] > stats.accepted_tokens["prediction"]
