"""Does a stream keep its pace while large request bodies arrive? Starts `ember serve MODEL`,
then alternates: one streamed completion alone (quiet), and the same stream while a second
process keeps posting the large bodies of tests/server/test_server_large_bodies.py (up to 8 MiB each:
parsing, validation, rendering and tokenization work for the server), all but the one that
submits 64 prompts of 500 tokens (a real generation load, which a stream rightly shares). Prints each round's
time per output token (TPOT, after the first token) and the loaded/quiet ratio.

    python benchmarks/large_body_tpot.py MODEL [--threads 2] [--rounds 3] [--tokens 160]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

TESTS = Path(__file__).resolve().parent.parent / "tests"

SENDER = """
import sys, threading
import httpx
sys.path[:0] = [{tests!r} + "/server", {tests!r}]
from test_server_large_bodies import _bodies
bodies = _bodies()
client = httpx.Client(base_url={url!r}, timeout=300, limits=httpx.Limits(max_connections=8))
def send(i):
    path, body = bodies[i]
    while True:
        client.post(path, content=body, headers={{"content-type": "application/json"}})
print("ready", flush=True)
for i in (0, 1, 2, 3, 4, 5, 7):
    threading.Thread(target=send, args=(i,), daemon=True).start()
sys.stdin.readline()
"""


def stream_tpot(url: str, n_tokens: int) -> float:
    """Seconds per streamed token after the first, for one greedy completion of n_tokens."""
    body = {"prompt": "Once upon a time", "max_tokens": n_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    stamps = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "serve", str(args.model), "--port", str(port),
         "--threads", str(args.threads), "--parallel", "4", "--ctx-size", "2048"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                sys.exit("the server did not start")
            time.sleep(0.2)
        stream_tpot(url, 8)  # warm-up
        quiet, loaded = [], []
        for _ in range(args.rounds):
            quiet.append(stream_tpot(url, args.tokens))
            sender = subprocess.Popen(
                [sys.executable, "-c", SENDER.format(tests=str(TESTS), url=url)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert sender.stdout is not None and sender.stdin is not None
            assert sender.stdout.readline().strip() == "ready"
            time.sleep(1.0)  # the bodies are in flight
            loaded.append(stream_tpot(url, args.tokens))
            sender.kill()
            sender.wait()
            print(f"quiet {quiet[-1] * 1e3:6.2f} ms/token   under large bodies "
                  f"{loaded[-1] * 1e3:6.2f} ms/token   ({loaded[-1] / quiet[-1]:.2f}x)", flush=True)
        q, lo = statistics.median(quiet), statistics.median(loaded)
        print(f"median: quiet {q * 1e3:.2f} ms, loaded {lo * 1e3:.2f} ms, ratio {lo / q:.2f}x")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
