"""No 500 for any client input: a deterministic corpus of malformed and hostile requests across
every endpoint and field (wrong types, huge and tiny numbers, lone surrogates, deep nesting,
truncated and non-JSON bodies, wrong Content-Types and methods) against a real server on
stories260K. Every answer must be 2xx or 4xx, every error in OpenAI's shape, and the server
healthy after each case with nothing left running."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_support import RunningServer, serving, wait_until

from ember.server.config import ServerConfig


@dataclass
class Case:
    method: str
    path: str
    body: bytes | None
    content_type: str | None = "application/json"

    def label(self) -> str:
        return f"{self.method} {self.path} {self.content_type} {(self.body or b'')[:120]!r}"


CHAT_BASE = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETION_BASE = {"prompt": "Once", "max_tokens": 2}
TOKENIZE_BASE = {"content": "Once upon a time"}
DETOKENIZE_BASE = {"tokens": [1, 2, 3]}

COMMON_FIELDS = ["model", "stream", "stream_options", "n", "temperature", "top_p", "top_k",
                 "min_p", "typical_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "seed", "stop", "logit_bias", "response_format",
                 "max_tokens", "user", "best_of"]
CHAT_FIELDS = [*COMMON_FIELDS, "messages", "max_completion_tokens", "logprobs", "top_logprobs",
               "tools", "functions"]
COMPLETION_FIELDS = [*COMMON_FIELDS, "prompt", "logprobs", "echo", "suffix"]
TOKENIZE_FIELDS = ["content", "prompt", "messages", "add_special", "add_special_tokens",
                   "parse_special", "with_pieces"]
DETOKENIZE_FIELDS = ["tokens"]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# Raw JSON texts for a field's value: every JSON type, edge numbers, hostile strings.
VALUES = [
    "null", "true", "false", "0", "-1", "1", "2", "0.5", "-0.0", "1e-400",
    "2147483647", "2147483648", "-2147483649", "9223372036854775808", "18446744073709551616",
    "1" + "0" * 400, "-1" + "0" * 400, "1e400", "-1e400", "1e38", "3.5e38",
    '""', '"x"', '"\\udc80"', '"\\ud800\\udc00"', '"a\\u0000b"', '"\\ud83d"', '"' + "é" * 3000 + '"',
    "[]", "{}", '[""]', '["\\udc80"]', "[1, 2]", '[{"a": 1}]', '{"type": "text"}',
    '{"type": "json_object"}', '{"include_usage": "\\udc80"}', '{"5": 1e400}', '{"\\udc80": 1}',
    '[' + ",".join(["-1"] * 50) + "]", '[[1, 2], [3, "x"]]', _deep(60), _deep(10_000),
]

MESSAGE_SHAPES = [
    '[{"role": "user"}]', '[{"role": "user", "content": null}]',
    '[{"role": "assistant", "content": null}]', '[{"role": "system", "content": ""}]',
    '[{"role": "tool", "content": "x", "tool_call_id": 5}]', '[{"role": "user", "content": []}]',
    '[{"role": "user", "content": [{"type": "text"}]}]',
    '[{"role": "user", "content": [{"type": "text", "text": 5}]}]',
    '[{"role": "user", "content": [{"type": "text", "text": "\\udc80"}]}]',
    '[{"role": "user", "content": [null]}]', '[{"role": "\\udc80", "content": "x"}]',
    '[{"role": "user", "content": "x", "name": {"a": ' + _deep(200) + "}}]",
    '[{"role": "user", "content": {"text": "x"}}]', '["user", "Hi"]', "[null]", "[[]]",
    '[{"role": "user", "content": "' + "Once upon a time " * 400 + '"}]',
    '[{"role": "user", "content": "<|im_start|>\\u0000\\uffff{{ 7*7 }}{% for %}"}]',
]

PROMPT_SHAPES = ['[1, 99999]', '[-1]', '[[1, 2], []]', '[1, "a"]', '["a", [1, 2]]',
                 '[true, false]', '[' + ",".join(['"x"'] * 70) + "]", '[[' + "1," * 600 + "1]]",
                 '"' + "Once upon a time " * 400 + '"', '"<s></s><unk>"', '[3.5]', '[[1e400]]']


def _with_field(base: dict, field: str, raw_value: str) -> bytes:
    rest = {k: v for k, v in base.items() if k != field}
    head = json.dumps(rest)[:-1]
    sep = ", " if rest else ""
    return f'{head}{sep}"{field}": {raw_value}}}'.encode()


def corpus() -> list[Case]:
    cases: list[Case] = []
    targets = [("/v1/chat/completions", CHAT_BASE, CHAT_FIELDS),
               ("/v1/completions", COMPLETION_BASE, COMPLETION_FIELDS),
               ("/tokenize", TOKENIZE_BASE, TOKENIZE_FIELDS),
               ("/detokenize", DETOKENIZE_BASE, DETOKENIZE_FIELDS)]
    rng = random.Random(14)
    for path, base, fields in targets:
        for field in fields:
            # every field gets the hardest values, plus 6 more drawn (with a fixed seed)
            hardest = ["2147483648", "1" + "0" * 400, "1e400", '"\\udc80"', _deep(10_000),
                       "[]"]
            picked = hardest + rng.sample([v for v in VALUES if v not in hardest], 6)
            cases += [Case("POST", path, _with_field(base, field, v)) for v in picked]
    cases += [Case("POST", "/v1/chat/completions", _with_field(CHAT_BASE, "messages", m))
              for m in MESSAGE_SHAPES]
    cases += [Case("POST", "/tokenize", _with_field(TOKENIZE_BASE, "messages", m))
              for m in MESSAGE_SHAPES[:8]]
    cases += [Case("POST", "/v1/completions", _with_field(COMPLETION_BASE, "prompt", p))
              for p in PROMPT_SHAPES]
    # Bodies that are not (whole) JSON objects.
    valid = json.dumps({**CHAT_BASE, "stream": True, "temperature": 0}).encode()
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                 "/chat/completions", "/completions"):
        for cut in (0, 1, 7, len(valid) // 2, len(valid) - 1):
            cases.append(Case("POST", path, valid[:cut]))
        for raw in (b"[1, 2]", b'"x"', b"null", b"42", b"\xff\xfe{}", b"\xef\xbb\xbf{}",
                    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1} trailing', b"\x00" * 16,
                    _deep(10_000).encode(), b'{"a": ' + _deep(5000).encode() + b"}",
                    b'{"messages": "\xc3\x28"}', bytes(rng.randrange(256) for _ in range(64))):
            cases.append(Case("POST", path, raw))
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", None, "application/json; charset=latin-1",
                             "application/jsonx", "APPLICATION/JSON"):
            cases.append(Case("POST", path, valid, content_type))
    # Methods and routes.
    for path in ("/health", "/metrics", "/slots", "/v1/models", "/models", "/v1/models/x",
                 "/v1/models/stories260K.gguf", "/v1/models/\u00e9", "/v1/nothing", "/"):
        cases.append(Case("GET", path, None, None))
        cases.append(Case("POST", path, b"{}"))
        cases.append(Case("DELETE", path, None, None))
    for path in ("/v1/chat/completions", "/tokenize"):
        cases.append(Case("GET", path, None, None))
        cases.append(Case("PUT", path, valid))
    return cases


def assert_openai_error(response: httpx.Response, label: str) -> None:
    assert response.headers.get("content-type", "").startswith("application/json"), label
    body = response.json()
    assert set(body) == {"error"}, label
    error = body["error"]
    # A prompt over the context also carries llama-server's counts (errors.context_exceeded).
    counts = {"n_prompt_tokens", "n_ctx"} if error.get("code") == "context_length_exceeded" else set()
    assert set(error) == {"message", "type", "param", "code"} | counts, label
    assert isinstance(error["message"], str) and error["message"], label
    assert "Traceback" not in response.text, label


@pytest.fixture(scope="module")
def server(stories_path: Path) -> Iterator[RunningServer]:
    with serving(ServerConfig(model=str(stories_path), parallel=2, threads=1,
                              ctx_size=512)) as running:
        yield running


def test_no_500_for_any_client_input(server: RunningServer) -> None:
    cases = corpus()
    assert len(cases) >= 300
    outcomes: Counter[int] = Counter()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for case in cases:
            headers = {"content-type": case.content_type} if case.content_type else {}
            response = client.request(case.method, case.path, content=case.body, headers=headers)
            outcomes[response.status_code] += 1
            assert response.status_code < 500, f"{response.status_code} for {case.label()}: " \
                                                f"{response.text[:300]}"
            if response.status_code >= 400:
                assert_openai_error(response, case.label())
            assert client.get("/health").status_code == 200, case.label()
    engine = server.server.ctx.engine
    assert engine is not None
    wait_until(lambda: engine.stats().running + engine.stats().waiting == 0, 10,
               "the engine to hold no request")
    assert not server.server.ctx.slots.live
    print(f"\nfuzz corpus: {len(cases)} cases, outcomes {dict(sorted(outcomes.items()))}")
    assert outcomes[200] > 0 and outcomes[400] > 0
