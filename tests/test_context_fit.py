"""ember.context_fit without a model: truncate-middle's kept tokens (n_keep, BOS, -1), the room
kept for the answer, and shift's whole turns (bisection against a plain scan)."""

from __future__ import annotations

import random

import pytest

from ember.context_fit import (
    Dropped,
    answer_room,
    fit_chat,
    fit_tokens,
    keep_ends,
    prompt_room,
    shift_turns,
)


def test_answer_room() -> None:
    assert answer_room(256, None) == 64           # a quarter without max_tokens
    assert answer_room(256, 8) == 8
    assert answer_room(256, 200) == 128           # at most half
    assert prompt_room(256, 8) == 248 and prompt_room(256, 0) == 256


def test_keep_ends() -> None:
    tokens = list(range(100, 120))
    assert keep_ends(tokens, 20) == (tokens, Dropped())
    assert keep_ends(tokens, 10) == (tokens[:5] + tokens[-5:], Dropped(10))
    assert keep_ends(tokens, 10, n_keep=3)[0] == tokens[:3] + tokens[-7:]
    # llama-server's n_keep does not count a leading BOS, which stays too.
    with_bos = [1, *tokens]
    assert keep_ends(with_bos, 10, n_keep=3, bos=1)[0] == with_bos[:4] + with_bos[-6:]
    # -1 (all) and more than the room keep all but the last 4 of the room from the start.
    assert keep_ends(tokens, 10, n_keep=-1)[0] == tokens[:6] + tokens[-4:]
    assert keep_ends(tokens, 10, n_keep=50)[0] == tokens[:6] + tokens[-4:]
    assert fit_tokens(tokens, "error", 8, None) == (tokens, Dropped())  # refused by the caller
    assert fit_tokens(tokens, "shift", 16, 6)[0] == tokens[:5] + tokens[-5:]  # no turns


def chars(messages: list[dict[str, str]]) -> list[int]:
    """A stand-in render + tokenize: 3 tokens of markup a message, one a content character."""
    return [0] * sum(3 + len(m["content"]) for m in messages)


def test_shift_matches_a_plain_scan_of_whole_turns() -> None:
    rng = random.Random(0)
    for _ in range(200):
        messages = [{"role": "system", "content": "s" * rng.randint(0, 9)}] * rng.randint(0, 2)
        for _ in range(rng.randint(0, 6)):
            messages.append({"role": "user", "content": "u" * rng.randint(1, 9)})
            for _ in range(rng.randint(0, 3)):  # answers, tool calls, tool results
                messages.append({"role": rng.choice(["assistant", "tool"]),
                                 "content": "a" * rng.randint(0, 9)})
        messages.append({"role": "user", "content": "q" * rng.randint(1, 9)})
        room = rng.randint(5, 60)
        kept, tokens, dropped = shift_turns(messages, chars, room)
        first = next(i for i, m in enumerate(messages) if m["role"] != "system")
        starts = [first] + [i for i in range(first + 1, len(messages))
                            if messages[i]["role"] == "user"]
        want = next((messages[:first] + messages[s:] for s in starts
                     if len(chars(messages[:first] + messages[s:])) <= room),
                    messages[:first] + messages[starts[-1]:])
        assert kept == want
        assert tokens == chars(want)
        assert dropped == Dropped(len(chars(messages)) - len(tokens), len(messages) - len(want))


@pytest.mark.parametrize("policy, n_kept, n_tokens, dropped", [
    ("error", 5, 27, Dropped()),
    # The system prompt and the last user turn (15 tokens) are still over the room of 14: one
    # more token goes from their middle.
    ("shift", 3, 14, Dropped(27 - 15 + 1, 2)),
    ("truncate-middle", 5, 14, Dropped(27 - 14)),
])
def test_fit_chat(policy: str, n_kept: int, n_tokens: int, dropped: Dropped) -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1u"},
                {"role": "assistant", "content": "a1a"}, {"role": "user", "content": "qqq"},
                {"role": "assistant", "content": ""}]  # 6 + 6 + 6 + 6 + 3 = 27 tokens
    kept, tokens, got = fit_chat(messages, chars, policy, 16, 2)  # room 14
    assert (len(kept), len(tokens), got) == (n_kept, n_tokens, dropped)
