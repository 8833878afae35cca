"""Structured output speed: grammar-mask cost per token on the model's vocabulary and on any
other vocabulary GGUF (e.g. ../shared/vocab/ggml-vocab-qwen2.gguf, 151,936 tokens), JSON Schema
compile time (first and cached), and single-stream decode with and without a JSON schema in
ember and, in the same run, in llama-server (its json_schema field), as ratios.

    python benchmarks/grammar_bench.py [--model M.gguf] [--vocab V.gguf ...] [--threads 2]

Mask cost: a schema's example document, tokenized with the vocabulary, walked through the
grammar; each step's mask is timed (GrammarState.mask: the same C++ call the sampler makes,
plus ~1 us of Python call). Decode: greedy, a schema whose string field keeps the model
writing, timings of the whole generation minus the first token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_peer import peer_binary  # noqa: E402
from serve_bench import running_server  # noqa: E402

from ember import _core  # noqa: E402
from ember.grammar import Constraint, GrammarCompiler  # noqa: E402

# (schema, an example document that matches it)
WORKLOAD = [
    ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
      "required": ["name", "age", "email", "tags"], "additionalProperties": False},
     {"name": "Alice Smith", "age": 31, "email": "alice@example.com", "tags": ["admin", "ops", "on call"]}),
    ({"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}, "qty": {"type": "integer", "minimum": 1},
        "price": {"type": "number"}}, "required": ["sku", "qty", "price"], "additionalProperties": False}},
     [{"sku": "AB123", "qty": 2, "price": 9.99}, {"sku": "ZZ900", "qty": 10, "price": 0.5}]),
    ({"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value", "children"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     {"value": 1, "children": [{"value": 2, "children": []}, {"value": 3, "children": [
         {"value": 4, "children": []}]}]}),
    ({"type": "object", "properties": {
        "event": {"type": "string", "maxLength": 60}, "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
        "status": {"enum": ["planned", "done", "cancelled"]}},
      "required": ["event", "day", "at", "id", "status"], "additionalProperties": False},
     {"event": "Quarterly planning meeting with the whole team", "day": "2024-05-01",
      "at": "2024-05-01T09:30:00Z", "id": "123e4567-e89b-12d3-a456-426614174000", "status": "planned"}),
]

# Keeps a model writing (a long free-text field), for decode timing.
LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 400, "maxLength": 2000}},
        "required": ["story"], "additionalProperties": False}


def walk(grammar: _core.Grammar, tokens: list[int], n_vocab: int) -> list[float]:
    """Microseconds of each step's mask along `tokens` (and the final one), from a fresh start."""
    state, steps = grammar.start(), []
    for token in [*tokens, None]:
        t0 = time.perf_counter()
        mask = state.mask(n_vocab)
        steps.append((time.perf_counter() - t0) * 1e6)
        if token is not None and (not (mask[token >> 5] >> (token & 31)) & 1 or not state.advance(token)):
            raise RuntimeError(f"the grammar rejects token {token} of its own example: {state.error}")
    return steps


def mask_costs(vocab_path: str, repeats: int = 3) -> dict:
    """Each step's cost is the least of `repeats` walks (a step costs the same every time; the
    least drops the time slices other processes took), after a first walk that warms
    llguidance's lazily built lexer (reported as first_walk_ms)."""
    tokenizer = _core.Tokenizer(vocab_path)
    n = tokenizer.n_vocab
    t0 = time.perf_counter()
    compiler = GrammarCompiler(tokenizer)
    setup_ms = (time.perf_counter() - t0) * 1e3
    steps, compile_ms, cached_ms, first_ms = [], [], [], []
    for schema, doc in WORKLOAD:
        constraint = Constraint.json_schema(schema)
        t0 = time.perf_counter()
        grammar = compiler.compile(constraint)
        compile_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        compiler.compile(constraint)
        cached_ms.append((time.perf_counter() - t0) * 1e3)
        tokens = tokenizer.encode(json.dumps(doc), False, False)
        first_ms.append(sum(walk(grammar, tokens, n)) / 1e3)
        walks = [walk(grammar, tokens, n) for _ in range(repeats)]
        steps += [min(costs) for costs in zip(*walks)]
    steps.sort()
    return {"vocab": Path(vocab_path).name, "n_vocab": n, "vocab_setup_ms": round(setup_ms, 1),
            "mask_us_mean": round(statistics.mean(steps), 1), "mask_us_p50": round(steps[len(steps) // 2], 1),
            "mask_us_p99": round(steps[int(len(steps) * 0.99)], 1), "mask_us_max": round(steps[-1], 1),
            "n_masks": len(steps), "first_walk_ms": [round(f, 1) for f in first_ms],
            "compile_ms": [round(c, 2) for c in compile_ms], "cached_compile_ms": round(max(cached_ms), 3)}


def ember_decode(model: str, threads: int, n_tokens: int, prompt: str) -> dict:
    import ember

    llm = ember.LLM(model, n_threads=threads, parallel=1)
    out = {}
    for label, schema in (("plain", None), ("json_schema", LONG)):
        rates = []
        for _ in range(3):
            result = llm.generate(prompt, temperature=0, max_tokens=n_tokens, ignore_eos=schema is None,
                                  json_schema=schema)
            rates.append(result.timings.generation_ms / max(1, len(result.tokens) - 1))
        out[f"{label}_ms_per_token"] = round(min(rates), 3)
    llm.close()
    return out


def ember_batch(model: str, threads: int, n_tokens: int, prompt: str, n: int = 8) -> dict:
    """ms per token of the unconstrained requests in a batch of n: all unconstrained, then half
    of them constrained (the steps are shared, so this is what constraints cost the others)."""
    import ember
    from ember.sampling import SamplingParams

    llm = ember.LLM(model, n_threads=threads, parallel=n)
    tokens = llm.tokenize(prompt)
    plain = SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=n_tokens, constraint=Constraint.json_schema(LONG))
    out = {}
    for label, half in (("all_plain", plain), ("half_constrained", constrained)):
        rates = []
        for _ in range(2):
            results = llm.engine.generate_batch([tokens] * n, [plain] * (n // 2) + [half] * (n - n // 2))
            rates.append(statistics.mean(r.timings.generation_ms / (len(r.tokens) - 1)
                                         for r in results[: n // 2]))
        out[f"{label}_ms_per_token"] = round(min(rates), 3)
    llm.close()
    ratio = out["half_constrained_ms_per_token"] / out["all_plain_ms_per_token"]
    out["unconstrained_slowdown"] = round(ratio - 1, 3)
    return out


def llama_server_decode(exe: str, model: str, threads: int, n_tokens: int, prompt: str) -> dict:
    port = 18000 + (int(time.time()) % 1000)
    args = [exe, "-m", model, "-t", str(threads), "--port", str(port), "-c", "2048", "-np", "1",
            "--host", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with running_server(args, url):
        out = {}
        for label, extra in (("plain", {"ignore_eos": True}), ("json_schema", {"json_schema": LONG})):
            rates = []
            for _ in range(3):
                body = {"prompt": prompt, "n_predict": n_tokens, "temperature": 0, "cache_prompt": False,
                        **extra}
                r = httpx.post(url + "/completion", json=body, timeout=600).json()
                rates.append(r["timings"]["predicted_per_token_ms"])
            out[f"{label}_ms_per_token"] = round(min(rates), 3)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF model (default: the demo SmolLM2)")
    ap.add_argument("--vocab", action="append", default=[], help="more vocabulary GGUFs for the mask cost")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: the peer build)")
    args = ap.parse_args()
    if args.model is None:
        from ember.hub.models import demo_model_path

        args.model = str(demo_model_path(quiet=True))
    report: dict = {"mask": [mask_costs(v) for v in [args.model, *args.vocab]]}
    prompt = "Write a long story about a dragon, as JSON with one field, story:"
    report["ember"] = ember_decode(args.model, args.threads, args.tokens, prompt)
    report["ember_batch"] = ember_batch(args.model, args.threads, args.tokens, prompt)
    exe = peer_binary("llama-server", args.llama_server)
    if exe:
        report["llama_server"] = llama_server_decode(exe, args.model, args.threads, args.tokens, prompt)
    for engine in ("ember", "llama_server"):
        if engine in report:
            r = report[engine]
            r["json_schema_overhead"] = round(r["json_schema_ms_per_token"] / r["plain_ms_per_token"] - 1, 3)
    model_mask = report["mask"][0]["mask_us_mean"] / 1e3
    report["ember"]["mask_share_of_decode"] = round(model_mask / report["ember"]["plain_ms_per_token"], 4)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
