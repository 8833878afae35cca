"""Python time per generated token in `ember serve`: CPU seconds the server's event-loop thread
spends per streamed token (reading engine events, detokenizing, stop strings, SSE chunks).

    python benchmarks/server_overhead.py [MODEL] [--streams 4] [--tokens 256]

Runs the real server (uvicorn on loopback, in this process) and streams --streams concurrent
chat completions of --tokens tokens each with the openai-compatible SSE protocol (httpx, from
other threads); the event loop's thread CPU time (its pthread CPU clock) divided by the tokens it relayed
is the figure (the target: under 0.2 ms). The engine thread's time is the model's, not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_support import start_server  # noqa: E402  (the tests' loopback server helper)

from ember.server.config import ServerConfig  # noqa: E402


def thread_cpu_seconds(thread: threading.Thread) -> float:
    """CPU time (user + system) one thread of this process has used, in seconds."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def stream_one(url: str, n_tokens: int, counts: list[int]) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "stream": True,
            "max_tokens": n_tokens, "temperature": 0, "logit_bias": {"2": -100, "0": -100}}
    n = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                n += bool(delta and delta[0]["delta"].get("content"))
    counts.append(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=str(Path(__file__).resolve().parent.parent
                                                        / "tests/data/stories260K.gguf"))
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    server = start_server(ServerConfig(model=args.model, parallel=args.streams,
                                       threads=args.threads, ctx_size=args.tokens + 64))
    loop_thread = server.thread
    try:
        stream_one(server.url, 8, [])  # warm-up
        counts: list[int] = []
        cpu0, wall0 = thread_cpu_seconds(loop_thread), time.perf_counter()
        clients = [threading.Thread(target=stream_one, args=(server.url, args.tokens, counts))
                   for _ in range(args.streams)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        cpu, wall = thread_cpu_seconds(loop_thread) - cpu0, time.perf_counter() - wall0
    finally:
        server.stop()
    n = sum(counts)
    print(f"{n} tokens in {wall:.2f} s ({n / wall:.0f} tokens/s); event-loop thread CPU "
          f"{cpu:.3f} s = {cpu / n * 1e3:.3f} ms per token")


if __name__ == "__main__":
    main()
