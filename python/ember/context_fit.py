"""Fitting a prompt into the context (--context-overflow): what becomes of a prompt that, with the
room kept for its answer, is longer than the context. One module for the server, `ember chat`,
`ember run` and ember.LLM; it knows tokens and messages, no API.

The policies:
- "error": the prompt runs as it is, and one longer than the context is refused (the server's
  400 context_length_exceeded), as OpenAI and llama-server answer.
- "shift": a chat drops its oldest whole turns (a user message and what answers it, up to the
  next user message) until the prompt fits; the leading system messages and the latest user
  turn stay (and the tools, rendered from the request each time), and the kept messages are
  rendered again, so no turn is cut inside its template markup (Ollama's truncation of a
  chat, llama-server's context shift). When the kept messages alone are still too long, or
  for a raw prompt (which has no turns), the middle is cut as truncate-middle does, the last
  resort.
- "truncate-middle": the first N and the last M tokens of the prompt are kept, the middle
  dropped: N is the request's n_keep (llama-server's: not counting a leading BOS, which is kept
  too; -1, "all of it", as much as leaves 4 tokens of the end), else half the room; M the rest.

The room: a fitted prompt gets the context less the room kept for the answer, which is
max_tokens when given (at most half the context, so a fitted prompt never shrinks below half
of it) and a quarter of the context otherwise. The answer itself still ends with
finish_reason "length" at the context's end: the engine never shifts it in generation (a
shift would rotate every cached key of the paged, prefix-shared KV cache).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

POLICIES = ("error", "truncate-middle", "shift")
ANSWER_SHARE = 4      # without max_tokens, the answer keeps 1/4 of the context
TAIL_TOKENS = 4       # truncate-middle keeps at least these last tokens (llama-server's n_ctx - 4)

Message = TypeVar("Message", bound=Any)


@dataclass(frozen=True)
class Dropped:
    """What fitting left out of a prompt."""

    tokens: int = 0    # prompt tokens (of the prompt as it came, rendered) not evaluated
    messages: int = 0  # whole messages left out (shift)

    def __add__(self, other: Dropped) -> Dropped:
        return Dropped(self.tokens + other.tokens, self.messages + other.messages)

    def __bool__(self) -> bool:
        return bool(self.tokens or self.messages)


def check_policy(policy: str, name: str = "context_overflow") -> str:
    """`policy`, or a ValueError naming the option (`name`) that gave it."""
    if policy not in POLICIES:
        raise ValueError(f"{name} must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def answer_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens of the context kept for the answer."""
    if max_tokens is None:
        return n_ctx // ANSWER_SHARE
    return min(max_tokens, n_ctx // 2)


def prompt_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens a fitted prompt may have."""
    return n_ctx - answer_room(n_ctx, max_tokens)


def keep_ends(tokens: Sequence[int], room: int, n_keep: int | None = None,
              bos: int | None = None) -> tuple[list[int], Dropped]:
    """truncate-middle: `tokens` as they are when they fit `room`, else their first N and last
    M tokens (N + M = room; see the module's docstring for N)."""
    tokens = list(tokens)
    if len(tokens) <= room:
        return tokens, Dropped()
    most = max(0, room - TAIL_TOKENS)
    if n_keep is None:
        head = room // 2
    else:
        has_bos = bos is not None and bool(tokens) and tokens[0] == bos
        head = most if n_keep < 0 else min(most, n_keep + has_bos)
    tail = room - head
    return tokens[:head] + tokens[len(tokens) - tail:], Dropped(len(tokens) - room)


def _turn_starts(messages: Sequence[Any]) -> list[int]:
    """Where the conversation may start after dropping whole turns: the first message after the
    leading system ones, then each later user message up to the latest."""
    first = 0
    while first < len(messages) and messages[first].get("role") == "system":
        first += 1
    users = [i for i in range(first, len(messages)) if messages[i].get("role") == "user"]
    return [first] + [i for i in users if i > first]


def shift_turns(messages: Sequence[Message], tokens_of: Callable[[list[Message]], list[int]],
                room: int) -> tuple[list[Message], list[int], Dropped]:
    """shift's whole turns: the messages kept (the leading system ones, then the latest turns
    that fit `room`), their tokens (tokens_of: messages rendered and tokenized) and what was
    dropped. Dropping more turns never gives more tokens, so the fewest drops that fit are
    found by bisection: about log2(turns) renders. The latest user turn always stays, even
    when it alone is longer than `room` (the caller then cuts its middle)."""
    messages = list(messages)
    starts = _turn_starts(messages)
    first = starts[0]

    def kept(k: int) -> list[Message]:
        return messages[:first] + messages[starts[k]:]

    full = tokens_of(messages)
    if len(full) <= room or len(starts) == 1:
        return messages, full, Dropped()
    low, high = 1, len(starts) - 1  # the fewest turns to drop lie in [low, high]
    best = tokens_of(kept(high))
    while low < high:
        mid = (low + high) // 2
        tokens = tokens_of(kept(mid))
        if len(tokens) <= room:
            high, best = mid, tokens
        else:
            low = mid + 1
    return kept(high), best, Dropped(len(full) - len(best), starts[high] - first)


def fit_tokens(tokens: Sequence[int], policy: str, n_ctx: int, max_tokens: int | None,
               n_keep: int | None = None, bos: int | None = None) -> tuple[list[int], Dropped]:
    """A raw prompt under `policy`: as it is ("error": the caller's context check refuses it),
    or its middle cut to the prompt room ("shift" and "truncate-middle")."""
    if policy == "error":
        return list(tokens), Dropped()
    return keep_ends(tokens, prompt_room(n_ctx, max_tokens), n_keep, bos)


def fit_chat(messages: Sequence[Message], tokens_of: Callable[[list[Message]], list[int]],
             policy: str, n_ctx: int, max_tokens: int | None, n_keep: int | None = None,
             bos: int | None = None) -> tuple[list[Message], list[int], Dropped]:
    """A chat under `policy`: the messages kept, the prompt's tokens, and what was dropped
    (tokens counted against the whole conversation's rendering)."""
    messages = list(messages)
    if policy == "error":
        return messages, tokens_of(messages), Dropped()
    room = prompt_room(n_ctx, max_tokens)
    if policy == "truncate-middle":
        tokens, dropped = keep_ends(tokens_of(messages), room, n_keep, bos)
        return messages, tokens, dropped
    kept, tokens, dropped = shift_turns(messages, tokens_of, room)
    tokens, cut = keep_ends(tokens, room, n_keep, bos)
    return kept, tokens, dropped + cut
