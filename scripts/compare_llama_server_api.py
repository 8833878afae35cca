"""Compares ember's llama-server-compatible answers with llama-server's own, on the same model:
the JSON fields each side has that the other lacks, and the greedy texts.

    llama-server -m MODEL.gguf --port 18181 &  ember serve MODEL.gguf --port 18182 &
    python scripts/compare_llama_server_api.py --llama http://127.0.0.1:18181 \\
        --ember http://127.0.0.1:18182
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx


def keys(value: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(prefix + k)
            out |= keys(v, prefix + k + ".")
    return out


def stream_events(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as response:
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: {")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama", required=True, help="llama-server's base URL")
    parser.add_argument("--ember", required=True, help="ember serve's base URL")
    args = parser.parse_args()
    servers = {"llama": args.llama.rstrip("/"), "ember": args.ember.rstrip("/")}

    def both(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return {name: httpx.request(method, url + path, json=body, timeout=120).json()
                for name, url in servers.items()}

    def report(what: str, answers: dict[str, Any]) -> None:
        a, b = keys(answers["llama"]), keys(answers["ember"])
        print(f"{what}\n  only llama-server: {sorted(a - b)}\n  only ember:        {sorted(b - a)}")

    completion = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}
    answers = both("POST", "/completion", completion)
    report("POST /completion", answers)
    for name, answer in answers.items():
        print(f"  {name}: {answer['content']!r} stop_type={answer['stop_type']}")
    events = {name: stream_events(url + "/completion", completion)
              for name, url in servers.items()}
    report("POST /completion (stream, a piece)", {n: e[0] for n, e in events.items()})
    report("POST /completion (stream, the end)", {n: e[-1] for n, e in events.items()})
    report("GET /props", both("GET", "/props"))
    report("GET /slots (first slot)", {n: v[0] for n, v in both("GET", "/slots").items()})
    prefill = {"messages": [{"role": "user", "content": "What is the capital of France?"},
                            {"role": "assistant", "content": "The capital of France is"}],
               "temperature": 0, "max_tokens": 8}
    for name, answer in both("POST", "/v1/chat/completions", prefill).items():
        print(f"prefilled chat, {name}: {answer['choices'][0]['message']['content']!r}")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                       {"type": "text", "text": "there"}]}]}
    for name, answer in both("POST", "/apply-template", parts).items():
        print(f"text parts, {name}: {answer['prompt']!r}")
    report("POST /v1/messages", both("POST", "/v1/messages", {
        "model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}))
    report("POST /v1/responses", both("POST", "/v1/responses", {
        "model": "x", "max_output_tokens": 8, "input": "Hi"}))


if __name__ == "__main__":
    main()
