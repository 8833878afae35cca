"""Structured output, side by side: the schema corpus (tests/data/structured/schemas.json) sent to
ember serve and llama-server on the same GGUF through their OpenAI endpoints
(response_format json_schema), at temperatures 0 and 0.8. Per schema kind and server: how many
answers finished (finish_reason stop), how many of those validate (jsonschema), how many ran
to max_tokens, and how many schemas the server refused (a 4xx: it cannot compile them).

    python benchmarks/structured_bench.py [--model M.gguf] [--max-tokens 256] [--servers ember,llama]
        [--seeds N] [--ember-pythonpath DIR] [--json out.json]

--ember-pythonpath runs another ember (e.g. /work/main/build/dev/pkg, for a before/after).

Measured 2026-12-07, SmolLM2-135M-Instruct Q4_1, 92 schemas x 2 temperatures, max_tokens 256, 2
shared cores, --parallel 8 (finished / valid of those / refused): llama-server 153 / 150 / 4
(it cannot compile the tuple schema or a "$ref": "#" recursion; 3 finished answers break the
schema: numbers outside a non-integer minimum/maximum, too many properties); ember before the
number bounds 142 / 142 / 0, after them 151 / 151 / 0. What still runs to max_tokens in
either server: endless text in strings without maxLength, recursion, arrays without maxItems.

Measured again 2026-12-07 with --seeds 3 (92 greedy + 276 sampled answers per server; same
file, machine and flags; 13 llama-server requests that hit the 600 s client timeout while the
machine was loaded were sent again on an idle one: 12 ran to max_tokens, 1 finished valid):
finished / valid / refused, ember 312 / 312 / 0, llama-server 312 / 304 / 8 (t=0: 73 / 73 / 0
against 73 / 71 / 2; t=0.8: 239 / 239 / 0 against 239 / 233 / 6). Per kind, ember finishes more
in any_of, array_of_objects, nested, optional (it compiles the tuple and "$ref": "#" schemas
llama-server refuses), fewer in format (an e-mail or date-time format that ember enforces and
llama-server reads as any string) and ref.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_peer import peer_binary  # noqa: E402
from serve_bench import running_server  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "structured" / "schemas.json"
MODEL = "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPERATURES = (0.0, 0.8)


def ask(url: str, entry: dict, temperature: float, max_tokens: int, seed: int) -> dict:
    """One request; its outcome: stop/length/refused/error, and for a stop whether it validates."""
    body = {"model": "m", "temperature": temperature, "max_tokens": max_tokens, "seed": seed,
            "messages": [{"role": "user", "content": "Answer with JSON matching this schema: "
                          + json.dumps(entry["schema"])}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "answer", "schema": entry["schema"]}}}
    try:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    except httpx.HTTPError as err:
        return {"outcome": "error", "detail": str(err)[:200]}
    if r.status_code >= 400:
        return {"outcome": "refused", "detail": r.text[:300]}
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] or ""
    out = {"outcome": choice["finish_reason"], "text": text[-120:]}
    if choice["finish_reason"] == "stop":
        try:
            jsonschema.validate(json.loads(text), entry["schema"])
            out["valid"] = True
        except (json.JSONDecodeError, jsonschema.ValidationError) as err:
            out["valid"] = False
            out["detail"] = str(err).splitlines()[0][:200]
    return out


def run_corpus(url: str, corpus: list[dict], max_tokens: int, workers: int, seeds: int) -> list[dict]:
    """Every schema once at temperature 0 (greedy: one answer) and `seeds` times at each other
    temperature (one sample per schema says little about a sampled finish rate)."""
    jobs = [(entry, t, i + 1000 * k) for t in TEMPERATURES for k in range(1 if t == 0 else seeds)
            for i, entry in enumerate(corpus)]
    with ThreadPoolExecutor(workers) as pool:
        outs = list(pool.map(lambda job: ask(url, job[0], job[1], max_tokens, job[2]), jobs))
    return [{"name": e["name"], "kind": e["kind"], "temperature": t, "seed": seed, **o}
            for (e, t, seed), o in zip(jobs, outs)]


def table(results: dict[str, list[dict]]) -> str:
    """Per kind: finished/total, valid of finished, length, refused, for each server."""
    servers = list(results)
    kinds = sorted({r["kind"] for rs in results.values() for r in rs})
    head = f"{'kind':<18}" + "".join(f"| {s + ' stop valid len refused':<34}" for s in servers)
    lines = [head, "-" * len(head)]
    rows = [(kind, lambda r, k=kind: r["kind"] == k) for kind in kinds]
    rows += [(f"ALL t={t}", lambda r, t=t: r["temperature"] == t) for t in TEMPERATURES]
    for kind, pick in [*rows, ("ALL", lambda r: True)]:
        row = f"{kind:<18}"
        for s in servers:
            rs = [r for r in results[s] if pick(r)]
            c = Counter(r["outcome"] for r in rs)
            valid = sum(1 for r in rs if r.get("valid"))
            row += f"| {c['stop']:>3}/{len(rs):<4} {valid:>4} {c['length']:>4} {c['refused']:>4}{'':<14}"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--servers", default="ember,llama", help="comma-separated: ember, llama")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="slots of each server and requests in flight")
    ap.add_argument("--ember-pythonpath", default=None, help="PYTHONPATH for the ember server")
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: the peer build)")
    ap.add_argument("--seeds", type=int, default=1, help="samples per schema at each temperature above 0")
    ap.add_argument("--json", default=None, help="write every outcome to this file")
    args = ap.parse_args()
    corpus = json.loads(CORPUS.read_text())
    port = 18500 + (int(time.time()) % 400)
    results: dict[str, list[dict]] = {}
    for server in args.servers.split(","):
        url = f"http://127.0.0.1:{port}"
        if server == "ember":
            env_path = args.ember_pythonpath or str(Path(__file__).resolve().parent.parent / "python")
            os.environ["PYTHONPATH"] = env_path
            cmd = [sys.executable, "-c", "from ember.cli import main; main()", "serve", args.model,
                   "--port", str(port), "--threads", str(args.threads), "--parallel", str(args.parallel)]
        else:
            exe = peer_binary("llama-server", args.llama_server)
            if exe is None:
                sys.exit("llama-server not found (build the peer or pass --llama-server)")
            cmd = [exe, "-m", args.model, "--port", str(port), "-t", str(args.threads), "--host", "127.0.0.1",
                   "-np", str(args.parallel), "-c", str(args.parallel * 1024), "--jinja"]
        start = time.time()
        with running_server(cmd, url):
            results[server] = run_corpus(url, corpus, args.max_tokens, args.parallel, args.seeds)
        print(f"{server}: {time.time() - start:.0f} s", file=sys.stderr)
        port += 1
    print(f"{len(corpus)} schemas x temperatures {TEMPERATURES} ({args.seeds} seeds above 0), "
          f"max_tokens {args.max_tokens}")
    print(table(results))
    for server, rs in results.items():
        for r in rs:
            if r["outcome"] == "stop" and not r.get("valid") or r["outcome"] in ("refused", "error"):
                print(f"{server} {r['name']} t={r['temperature']}: {r['outcome']} {r.get('detail', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
