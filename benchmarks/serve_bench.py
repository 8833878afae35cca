"""Load benchmark for any OpenAI-compatible server (ember serve, llama-server, vLLM, ...).

    python benchmarks/serve_bench.py --url http://127.0.0.1:8080/v1 --concurrency 1,8,16
    python benchmarks/serve_bench.py --url ... --ignore-eos-ids 0,2 --max-tokens 64 --json out.json

At each concurrency level C, C clients send streamed chat completions back to back (async
httpx, one connection each) until `--requests` requests (default 2*C, at least 4) have
finished, and the level reports:
  - request throughput (requests/s) and output throughput (generated tokens/s, from usage),
  - time to first token: from sending the request to the first content chunk,
  - time per output token: per request, (last token - first token) / (tokens - 1),
with mean, p50 and p99 over the level's requests. One unmeasured request warms each level up.
--ignore-eos-ids sends logit_bias -100 for those token ids, so every request generates exactly
max_tokens (compare servers on equal work); prompts rotate through a fixed list so a prefix cache
only helps with the shared template prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import httpx

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "Describe a walk through a busy market in the morning.",
    "What are the main differences between rivers and glaciers?",
    "Give advice to someone learning to cook their first meal.",
    "Tell me about the history of the bicycle.",
    "Write a letter from a cat to its owner.",
    "Why do leaves change colour in autumn?",
]


@dataclass
class RequestResult:
    ttft: float              # seconds to the first content chunk
    latency: float           # seconds to the end of the stream
    n_tokens: int            # completion tokens (usage, else content chunks)
    tpot: float | None       # seconds per token after the first
    error: str | None = None


@dataclass
class LevelReport:
    concurrency: int
    n_requests: int
    n_errors: int
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    tpot_ms: dict[str, float] = field(default_factory=dict)
    latency_s: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def running_server(cmd: list[str], url: str) -> Iterator[subprocess.Popen]:
    """Starts a server (`cmd`, output discarded), waits up to 2 minutes for `url`/health to
    answer 200, and stops the server when the block ends."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _summary(values: list[float], scale: float) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    return {"mean": statistics.fmean(values) * scale, "p50": _percentile(values, 0.5) * scale,
            "p99": _percentile(values, 0.99) * scale}


async def one_request(http: httpx.AsyncClient, args: argparse.Namespace,
                      prompt: str) -> RequestResult:
    body: dict = {"messages": [{"role": "user", "content": prompt}],
                  "max_tokens": args.max_tokens, "temperature": args.temperature,
                  "stream": True, "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    if args.ignore_eos_ids:
        body["logit_bias"] = {str(t): -100 for t in args.ignore_eos_ids}
    start = time.perf_counter()
    first = last = None
    n_chunks, n_usage = 0, None
    try:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return RequestResult(0, 0, 0, None, f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestResult(0, 0, 0, None, str(chunk["error"])[:200])
                if chunk.get("usage"):
                    n_usage = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        n_chunks += 1
    except httpx.HTTPError as err:
        return RequestResult(0, 0, 0, None, f"{type(err).__name__}: {err}")
    end = time.perf_counter()
    if first is None or last is None:
        return RequestResult(0, end - start, 0, None, "no content")
    n_tokens = n_usage if n_usage is not None else n_chunks
    tpot = (last - first) / (n_tokens - 1) if n_tokens > 1 else None
    return RequestResult(first - start, end - start, n_tokens, tpot)


async def run_level(args: argparse.Namespace, concurrency: int,
                    prompts: list[str] | None = None) -> LevelReport:
    """prompts: what the clients send in turn (default: PROMPTS)."""
    prompts = prompts or PROMPTS
    n_requests = args.requests or max(4, 2 * concurrency)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=httpx.Timeout(args.timeout)) as http:
        warm = await one_request(http, args, prompts[0])
        if warm.error:
            raise SystemExit(f"warm-up request failed: {warm.error}")
        results: list[RequestResult] = []
        counter = iter(range(n_requests))

        async def client() -> None:
            for i in counter:
                results.append(await one_request(http, args, prompts[i % len(prompts)]))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ok = [r for r in results if r.error is None]
    for r in results:
        if r.error:
            print(f"  error: {r.error}", file=sys.stderr)
    return LevelReport(
        concurrency=concurrency, n_requests=len(results), n_errors=len(results) - len(ok),
        wall_s=wall, requests_per_s=len(ok) / wall,
        output_tokens_per_s=sum(r.n_tokens for r in ok) / wall,
        ttft_ms=_summary([r.ttft for r in ok], 1e3),
        tpot_ms=_summary([r.tpot for r in ok if r.tpot is not None], 1e3),
        latency_s=_summary([r.latency for r in ok], 1.0))


def print_table(label: str, reports: list[LevelReport]) -> None:
    print(f"\n{label}")
    print(f"{'conc':>4} {'reqs':>5} {'err':>3} {'req/s':>7} {'tok/s':>8} "
          f"{'ttft mean/p50/p99 ms':>24} {'tpot mean/p50/p99 ms':>24}")
    for r in reports:
        ttft = "/".join(f"{r.ttft_ms[k]:.0f}" for k in ("mean", "p50", "p99"))
        tpot = "/".join(f"{r.tpot_ms[k]:.1f}" for k in ("mean", "p50", "p99"))
        print(f"{r.concurrency:>4} {r.n_requests:>5} {r.n_errors:>3} {r.requests_per_s:>7.2f} "
              f"{r.output_tokens_per_s:>8.1f} {ttft:>24} {tpot:>24}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080/v1",
                        help="the server's OpenAI base URL (ending in /v1)")
    parser.add_argument("--model", default="", help="model name to send (default: none)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--concurrency", default="1,8,16",
                        help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=0,
                        help="requests per level (default: 2 x concurrency, at least 4)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos-ids", default="",
                        help="comma-separated token ids to ban (fixed-length outputs)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--json", default="", help="also write the reports to this file")
    args = parser.parse_args()
    args.ignore_eos_ids = [int(t) for t in args.ignore_eos_ids.split(",") if t.strip()]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    reports = [asyncio.run(run_level(args, c)) for c in levels]
    label = args.label or args.url
    print_table(f"{label}  (max_tokens={args.max_tokens})", reports)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": label, "max_tokens": args.max_tokens,
                       "levels": [asdict(r) for r in reports]}, f, indent=2)


if __name__ == "__main__":
    main()
