"""A soak test, bounded to well under a minute: 32 concurrent clients send a fixed mix of valid,
invalid, cancelled and streaming requests to `ember serve` (its own process, so its file
descriptors and memory are its own), then the server's invariants hold: nothing running or
waiting, KV usage 0, file descriptors back to where they started (within 4), RSS growth under
64 MiB, and no answer was a 5xx."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_support import sample, serve_process, wait_until

N_CLIENTS = 32
REQUESTS_PER_CLIENT = 48
MAX_RSS_GROWTH = 64 << 20
MAX_FD_GROWTH = 4


@dataclass
class Served:
    url: str
    process: subprocess.Popen[str]

    def n_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/PID/status")


@pytest.fixture(scope="module")
def served(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not Path("/proc/self/fd").is_dir():
        pytest.fail("the soak test reads /proc (Linux)")
    args = ["--parallel", "4", "--max-queue", "24", "--threads", "1", "--ctx-size", "256"]
    with serve_process(stories_path, args, tmp_path_factory.mktemp("serve")) as (url, process):
        yield Served(url, process)


CHAT = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8}
PROMPT = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.8}


async def one_request(client: httpx.AsyncClient, kind: str, outcomes: Counter[str]) -> None:
    if kind == "chat":
        r = await client.post("/v1/chat/completions", json=CHAT)
        outcomes[f"chat {r.status_code}"] += 1
        if r.status_code == 200:
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    elif kind == "stream":
        async with client.stream("POST", "/v1/completions", json={**PROMPT, "stream": True}) as r:
            body = (await r.aread()).decode()
        outcomes[f"stream {r.status_code}"] += 1
        if r.status_code == 200:
            assert body.rstrip().endswith("data: [DONE]"), body[-200:]
    elif kind == "invalid":
        bad = random.choice([b'{"prompt": "x", "top_k": 2147483648}', b'{"messages": []}',
                             b'{"prompt": "\\udc80"}', b"[" * 5000, b'{"prompt": "a", "n": 99}'])
        r = await client.post("/v1/completions", content=bad,
                              headers={"content-type": "application/json"})
        outcomes[f"invalid {r.status_code}"] += 1
        assert r.status_code == 400, r.text
    elif kind == "cancel-stream":  # read the first event, then hang up
        async with client.stream("POST", "/v1/chat/completions",
                                 json={**CHAT, "max_tokens": 200, "stream": True}) as r:
            async for _ in r.aiter_bytes():
                break
        outcomes[f"cancel-stream {r.status_code}"] += 1
    elif kind == "cancel-wait":  # give up before the answer comes
        try:
            r = await client.post("/v1/completions", json={**PROMPT, "max_tokens": 200},
                                  timeout=0.05)
            outcomes[f"cancel-wait {r.status_code}"] += 1
        except httpx.TimeoutException:
            outcomes["cancel-wait gave up"] += 1
    else:
        raise AssertionError(kind)


async def soak(url: str) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    kinds = ["chat", "stream", "invalid", "cancel-stream", "cancel-wait"]

    async def client_loop(index: int) -> None:
        rng = random.Random(index)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for i in range(REQUESTS_PER_CLIENT):
                kind = rng.choice(kinds)
                try:
                    await one_request(client, kind, outcomes)
                except httpx.TransportError as err:
                    raise AssertionError(f"client {index}, request {i} ({kind}): "
                                         f"{type(err).__name__} {err}") from None

    await asyncio.gather(*(client_loop(i) for i in range(N_CLIENTS)))
    return outcomes


def test_soak_leaves_the_server_as_it_found_it(served: Served) -> None:
    url = served.url
    asyncio.run(soak_warmup(url))
    fds_before, rss_before = served.n_fds(), served.rss_bytes()
    start = time.monotonic()
    random.seed(8)
    outcomes = asyncio.run(soak(url))
    elapsed = time.monotonic() - start

    def idle() -> bool:
        return (sample(url, "ember_requests_running") == 0
                and sample(url, "ember_requests_waiting") == 0
                and sample(url, "ember_kv_cache_usage_ratio") == 0)

    wait_until(idle, 10, "nothing running or waiting and KV usage 0")
    try:
        wait_until(lambda: served.n_fds() <= fds_before + MAX_FD_GROWTH, 10,
                   "file descriptors back near the start")
    except AssertionError:
        fd_dir = Path(f"/proc/{served.process.pid}/fd")
        targets = Counter(os.readlink(fd_dir / f) for f in os.listdir(fd_dir))
        raise AssertionError(f"{fds_before} fds before, {served.n_fds()} after: {targets}") from None
    fds_after, rss_after = served.n_fds(), served.rss_bytes()
    slots = httpx.get(url + "/slots").json()
    report = {"seconds": round(elapsed, 1), "outcomes": dict(sorted(outcomes.items())),
              "fds": [fds_before, fds_after], "rss_mib": [round(rss_before / 2**20, 1),
                                                         round(rss_after / 2**20, 1)]}
    print("\nsoak:", json.dumps(report))
    assert sum(outcomes.values()) == N_CLIENTS * REQUESTS_PER_CLIENT
    assert not [k for k in outcomes if k.split()[-1].startswith("5") and k.split()[-1] != "503"]
    assert outcomes["chat 200"] > 0 and outcomes["stream 200"] > 0
    assert not any(s["is_processing"] for s in slots)
    assert rss_after - rss_before < MAX_RSS_GROWTH, report
    assert elapsed < 50, elapsed


async def soak_warmup(url: str) -> None:
    """A few requests of each kind first, so allocations that happen once are not counted."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        outcomes: Counter[str] = Counter()
        for kind in ("chat", "stream", "invalid", "cancel-stream", "cancel-wait") * 2:
            await one_request(client, kind, outcomes)
