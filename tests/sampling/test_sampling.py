"""The C++ sampler chain on fixed logits: each stage's arithmetic against numbers worked out by
hand (or by numpy where a closed form is awkward), the seeded draw, logprobs and stop strings."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from ember import _core

# p = [1/2, 1/4, 1/8, 1/8]: every stage below has a distribution that is easy to do by hand.
HALVES = np.log(np.array([0.5, 0.25, 0.125, 0.125], dtype=np.float32))

# Every filter off, temperature 1: the sampler's distribution is the plain softmax.
PLAIN = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0}


def make_sampler(n_vocab: int, **fields: object) -> _core.Sampler:
    """A C++ sampler with the C++ defaults, but for `fields` (logit_bias as a dict)."""
    if isinstance(fields.get("logit_bias"), dict):
        fields["logit_bias"] = list(fields["logit_bias"].items())
    return _core.Sampler(_core.SamplingParams(**fields), n_vocab)


def dist(logits: np.ndarray, **params: object) -> dict[int, float]:
    ids, probs = make_sampler(len(logits), **{**PLAIN, **params}).distribution(logits)
    return {int(i): float(p) for i, p in zip(ids, probs)}


def assert_dist(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    for token, p in want.items():
        assert got[token] == pytest.approx(p, rel=1e-6), token


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


# --- the stages --------------------------------------------------------------------------------

def test_plain_softmax() -> None:
    assert_dist(dist(HALVES), {0: 0.5, 1: 0.25, 2: 0.125, 3: 0.125})


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    assert dist(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32), temperature=0.0) == {1: 1.0}
    sampler = make_sampler(4, temperature=0.0, seed=123)
    assert [sampler.sample(HALVES) for _ in range(5)] == [0] * 5


def test_greedy_sample_agrees_with_the_full_path() -> None:
    """sample() at temperature 0 without penalties skips building candidates: it must pick what
    distribution() picks, ties (lowest id) and logit bias (applied in order) included."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 300))
        logits = rng.integers(-3, 4, size=n).astype(np.float32)  # many ties
        bias = {int(i): float(rng.integers(-2, 3)) for i in rng.integers(0, n, size=3)}
        if trial % 3 == 0:
            bias = {}
        sampler = make_sampler(n, temperature=0.0, seed=1, logit_bias=bias)
        ids, _ = sampler.distribution(logits)
        assert sampler.sample(logits) == ids[0], (logits, bias)
        biased = logits.copy()
        for i, d in bias.items():
            biased[i] += d
        assert sampler.sample(logits) == int(np.argmax(biased))


def test_temperature_divides_logits() -> None:
    # T = 0.5 squares the probabilities: [1/4, 1/16, 1/64, 1/64] / (22/64).
    assert_dist(dist(HALVES, temperature=0.5), {0: 16 / 22, 1: 4 / 22, 2: 1 / 22, 3: 1 / 22})
    # T = 2 takes square roots.
    r = np.sqrt([0.5, 0.25, 0.125, 0.125])
    assert_dist(dist(HALVES, temperature=2.0), dict(enumerate(r / r.sum())))


def test_top_k() -> None:
    assert_dist(dist(HALVES, top_k=2), {0: 2 / 3, 1: 1 / 3})
    assert_dist(dist(HALVES, top_k=1), {0: 1.0})
    # On a tie at the cut the lower id stays.
    assert_dist(dist(HALVES, top_k=3), {0: 4 / 7, 1: 2 / 7, 2: 1 / 7})
    assert len(dist(HALVES, top_k=0)) == 4 and len(dist(HALVES, top_k=99)) == 4


def test_top_p() -> None:
    # Cumulative 0.5, 0.75, 0.875, 1: the nucleus is the shortest prefix reaching p.
    assert_dist(dist(HALVES, top_p=0.7), {0: 2 / 3, 1: 1 / 3})
    assert_dist(dist(HALVES, top_p=0.5), {0: 1.0})
    assert_dist(dist(HALVES, top_p=0.8), {0: 4 / 7, 1: 2 / 7, 2: 1 / 7})
    assert len(dist(HALVES, top_p=1.0)) == 4


def test_top_p_on_a_large_vocabulary_sorts_only_what_it_needs() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 50_000).astype(np.float32)
    p = softmax(logits)
    order = np.argsort(-p, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(p[order]), 0.9) + 1)
    got = dist(logits, top_p=0.9)
    assert set(got) == set(order[:n_keep].tolist())
    kept = p[order[:n_keep]]
    for token, want in zip(order[:n_keep], kept / kept.sum()):
        assert got[int(token)] == pytest.approx(want, rel=1e-4)


def test_min_p() -> None:
    # Threshold 0.3 * 0.5 = 0.15 keeps 1/2 and 1/4.
    assert_dist(dist(HALVES, min_p=0.3), {0: 2 / 3, 1: 1 / 3})
    assert_dist(dist(HALVES, min_p=0.6), {0: 1.0})
    assert len(dist(HALVES, min_p=0.2)) == 4


def test_typical_p() -> None:
    # H = 1.75 ln 2; surprises are 1, 2, 3, 3 (x ln 2), so distances from H are 0.75, 0.25, 1.25,
    # 1.25: token 1 is the most typical, then 0. Mass 0.25 then 0.75 >= 0.7.
    got = dist(HALVES, typical_p=0.7)
    assert_dist(got, {1: 1 / 3, 0: 2 / 3})
    assert list(got) == [1, 0]  # candidates come out in typicality order
    assert_dist(dist(HALVES, typical_p=0.2), {1: 1.0})


def test_typical_p_on_a_large_vocabulary() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 30_000).astype(np.float32)
    p = softmax(logits)
    entropy = -(p * np.log(p)).sum()
    order = np.lexsort((np.arange(len(p)), np.abs(-np.log(p) - entropy)))
    n_keep = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)
    got = dist(logits, typical_p=0.6)
    assert list(got) == order[:n_keep].tolist()
    kept = p[order[:n_keep]]
    np.testing.assert_allclose(list(got.values()), kept / kept.sum(), rtol=1e-4)


def test_stage_order_top_k_then_top_p_then_temperature() -> None:
    # top_k=3 -> [4/7, 2/7, 1/7]; top_p=0.8 on those: 0.571, 0.857 -> two left; T=2 -> sqrt.
    r = np.sqrt([4 / 7, 2 / 7])
    assert_dist(dist(HALVES, top_k=3, top_p=0.8, temperature=2.0), dict(enumerate(r / r.sum())))


# --- penalties and logit bias ---------------------------------------------------------------

LOGITS = np.array([2.0, -1.0, 0.5, 1.0], dtype=np.float32)


def penalized(history: list[int], **params: object) -> dict[int, float]:
    sampler = make_sampler(4, **{**PLAIN, **params})
    sampler.accept_many(history)
    ids, probs = sampler.distribution(LOGITS)
    return {int(i): float(p) for i, p in zip(ids, probs)}


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    # Tokens 0 and 1 seen: 2 / 2 = 1 and -1 * 2 = -2; 2 and 3 untouched.
    got = penalized([0, 1, 0], repeat_penalty=2.0)
    assert_dist(got, dict(enumerate(softmax([1.0, -2.0, 0.5, 1.0]))))


def test_frequency_and_presence_penalties() -> None:
    # Token 0 seen twice: 2 - 2 * 0.5 - 0.25 = 0.75; token 1 once: -1 - 0.5 - 0.25 = -1.75.
    got = penalized([0, 1, 0], frequency_penalty=0.5, presence_penalty=0.25)
    assert_dist(got, dict(enumerate(softmax([0.75, -1.75, 0.5, 1.0]))))
    # All three together, repetition first: token 0: 2 / 2 - 1 - 0.25 = -0.25.
    got = penalized([0, 1, 0], repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    assert_dist(got, dict(enumerate(softmax([-0.25, -2.75, 0.5, 1.0]))))


def test_penalty_window_holds_the_last_n_tokens() -> None:
    # Window of 2 after 0, 1, 2, 2: only [2, 2] counts, so token 2: 0.5 - 2 * 1.0 = -1.5.
    got = penalized([0, 1, 2, 2], repeat_last_n=2, frequency_penalty=1.0)
    assert_dist(got, dict(enumerate(softmax([2.0, -1.0, -1.5, 1.0]))))
    # 0 turns penalties off; -1 counts everything seen.
    assert_dist(penalized([0, 0], repeat_last_n=0, frequency_penalty=1.0),
                dict(enumerate(softmax(LOGITS))))
    got = penalized([0] * 100 + [3], repeat_last_n=-1, frequency_penalty=0.01)
    assert_dist(got, dict(enumerate(softmax([1.0, -1.0, 0.5, 0.99]))))


def test_penalty_window_wraps_many_times() -> None:
    sampler = make_sampler(4, **PLAIN, repeat_last_n=3, presence_penalty=1.0)
    sampler.accept_many([0, 1, 2, 3] * 50 + [1, 1, 1])  # window: [1, 1, 1]
    _, probs = sampler.distribution(LOGITS)
    np.testing.assert_allclose(probs, softmax([2.0, -2.0, 0.5, 1.0]), rtol=1e-6)


def test_reset_empties_the_window() -> None:
    sampler = make_sampler(4, **PLAIN, frequency_penalty=1.0)
    sampler.accept_many([0, 0, 0])
    sampler.reset()
    _, probs = sampler.distribution(LOGITS)
    np.testing.assert_allclose(probs, softmax(LOGITS), rtol=1e-6)


def test_logit_bias() -> None:
    assert dist(LOGITS, temperature=0.0, logit_bias={3: 1.5}) == {3: 1.0}
    assert dist(LOGITS, temperature=0.0, logit_bias={0: -math.inf}) == {3: 1.0}
    assert_dist(dist(LOGITS, logit_bias={1: 1.0, 2: -0.5}),
                dict(enumerate(softmax([2.0, 0.0, 0.0, 1.0]))))


def test_greedy_still_applies_penalties() -> None:
    assert penalized([0], temperature=0.0, repeat_penalty=4.0) == {3: 1.0}


# --- the draw -----------------------------------------------------------------------------------

def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    logits = np.zeros(1000, dtype=np.float32)

    def draws(seed: int) -> list[int]:
        sampler = make_sampler(1000, **PLAIN, seed=seed)
        return [sampler.sample(logits) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    sampler = make_sampler(1000, **PLAIN, seed=7)
    first = [sampler.sample(logits) for _ in range(50)]
    sampler.reset()
    assert [sampler.sample(logits) for _ in range(50)] == first


def test_draw_frequencies_follow_the_distribution() -> None:
    sampler = make_sampler(4, **PLAIN, seed=1)
    n = 40_000
    counts = np.bincount([sampler.sample(HALVES) for _ in range(n)], minlength=4) / n
    np.testing.assert_allclose(counts, [0.5, 0.25, 0.125, 0.125], atol=0.01)


# --- logprobs ---------------------------------------------------------------------------------

def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    logits = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    log_z = 4.0 + math.log(sum(math.exp(x - 4.0) for x in [1.0, 2.0, 3.0, 4.0]))
    logprob, top = _core.token_logprobs(logits, 1, 2)
    assert logprob == pytest.approx(2.0 - log_z, rel=1e-6)
    assert [t for t, _ in top] == [3, 2]
    assert [lp for _, lp in top] == pytest.approx([4.0 - log_z, 3.0 - log_z], rel=1e-6)
    assert _core.token_logprobs(HALVES, 0, 0) == (pytest.approx(math.log(0.5)), [])
    _, top = _core.token_logprobs(HALVES, 0, 10)
    assert [t for t, _ in top] == [0, 1, 2, 3]


# --- stop strings -------------------------------------------------------------------------------

def run_stops(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    matcher = _core.StopStringMatcher(stops)
    out = ""
    for piece in pieces:
        text, stopped, stop = matcher.push(piece)
        out += text
        if stopped:
            return out, stop
    return out + matcher.flush(), None


def test_stop_string_split_across_pieces_is_never_emitted() -> None:
    matcher = _core.StopStringMatcher(["</s>"])
    assert matcher.push("Hello <") == ("Hello ", False, "")
    assert matcher.push("/") == ("", False, "")
    assert matcher.push("s") == ("", False, "")
    assert matcher.push("> world") == ("", True, "</s>")
    assert matcher.stopped and matcher.push("more") == ("", True, "")


def test_held_back_text_is_released_when_it_stops_matching() -> None:
    matcher = _core.StopStringMatcher(["User:"])
    assert matcher.push("Us") == ("", False, "")
    assert matcher.push("ually") == ("Usually", False, "")
    assert matcher.push(" U") == (" ", False, "")
    assert matcher.flush() == "U"


def test_earliest_stop_string_wins() -> None:
    assert run_stops(["world", "lo w"], ["Hel", "lo world"]) == ("Hel", "lo w")
    assert run_stops(["\n\n", "."], ["One. Two\n\n"]) == ("One", ".")
    assert run_stops(["xyz"], ["a", "b", "c"]) == ("abc", None)
    assert run_stops([], ["abc"]) == ("abc", None)
    assert run_stops(["é!"], ["café", "!"]) == ("caf", "é!")


# --- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("params, message", [
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"min_p": 2.0}, "min_p must be in [0, 1]"),
    ({"typical_p": 0.0}, "typical_p must be in (0, 1]"),
    ({"repeat_penalty": 0.0}, "repeat_penalty must be > 0"),
    ({"repeat_last_n": -2}, "repeat_last_n must be >= -1"),
    ({"logit_bias": {4: 1.0}}, "logit_bias: token id 4 is outside [0, 4)"),
])
def test_bad_parameters_raise_value_error(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"\[sampling\] " + re.escape(message)):
        make_sampler(4, **params)


def test_wrong_logits_length_raises() -> None:
    sampler = make_sampler(5)
    with pytest.raises(ValueError, match="expected 5 values"):
        sampler.sample(HALVES)


# --- min_tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_holds_the_stop_ids_back_until_that_many_outputs(temperature: float) -> None:
    # Token 0 is by far the most likely: a stop id, it may come only as the fourth output.
    logits = np.array([10.0, 0.0, -1.0, -2.0], dtype=np.float32)
    sampler = _core.Sampler(_core.SamplingParams(**{**PLAIN, "temperature": temperature},
                                                 min_tokens=3, seed=1), 4, stop_ids=[0, 3])
    outputs = []
    for _ in range(4):
        token = sampler.sample(logits)
        sampler.advance(token)
        outputs.append(token)
    assert all(t in (1, 2) for t in outputs[:3]) and outputs[3] == 0
    # Without stop ids min_tokens holds nothing back.
    free = _core.Sampler(_core.SamplingParams(**{**PLAIN, "temperature": 0.0}, min_tokens=3), 4)
    assert free.sample(logits) == 0


def test_min_tokens_is_checked() -> None:
    with pytest.raises(ValueError, match="min_tokens must be >= 0"):
        _core.SamplingParams(min_tokens=-1).validate(4)
