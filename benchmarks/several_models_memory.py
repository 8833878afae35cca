"""The resident memory of `ember serve` with several models: started (none loaded), after each
model's first request, and after --keep-alive has unloaded them. Reads VmRSS of the server
process from /proc (Linux).

    python benchmarks/several_models_memory.py A.gguf B.gguf [--ctx-size 512] [--parallel 1]

Each model is served under its file name without .gguf, so two copies of one file (cp, not a
link) count as two models."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_support import free_socket, wait_until  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--ctx-size", type=int, default=512)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--keep-alive", default="3s")
    parser.add_argument("--cycles", type=int, default=1, help="load-all-then-unload rounds")
    args = parser.parse_args()
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "ember.cli", "serve", *map(str, args.models), "--port",
           str(port), "--ctx-size", str(args.ctx_size), "--parallel", str(args.parallel),
           "--keep-alive", args.keep_alive, "--threads", "1"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ})
    try:
        def up() -> bool:
            if server.poll() is not None:
                raise SystemExit(f"the server exited ({server.returncode}): {' '.join(cmd)}")
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, 120, "the server to answer")

        def all_unloaded() -> bool:
            data = httpx.get(url + "/v1/models").json()["data"]
            return all(m["status"]["value"] == "unloaded" for m in data)

        names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        print(f"started, none loaded: {rss_mib(server.pid):8.1f} MiB")
        for cycle in range(1, args.cycles + 1):
            for n, name in enumerate(names, 1):
                r = httpx.post(url + "/v1/completions", timeout=120,
                               json={"model": name, "prompt": "Hello", "max_tokens": 8})
                r.raise_for_status()
                print(f"round {cycle}: {n} loaded ({name}): {rss_mib(server.pid):8.1f} MiB")

            wait_until(all_unloaded, 120, "the models to unload")
            time.sleep(0.5)
            print(f"round {cycle}: all unloaded (--keep-alive {args.keep_alive}): "
                  f"{rss_mib(server.pid):8.1f} MiB")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
