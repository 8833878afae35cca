"""Speculative decoding, ember against llama.cpp on the same files, threads and prompts, in one
run: prompt lookup on a copy-heavy request (SmolLM2 Q4_1; llama.cpp's llama-lookup), a draft
model (SmolLM2 dequantized to f16 as target, the Q4_1 file as draft; llama-speculative),
Predicted Outputs on two "change one line of this code" requests (llama.cpp has no such field;
its nearest is llama-lookup over the prompt that holds the code), and 16 concurrent requests
with and without speculation (ember only): on the engine (copy tasks, and free writing where
drafts mostly fail; the two engines take turns, a batch each) and through HTTP (`ember serve
--parallel 16` and 16 streaming clients). Baselines without speculation: ember's own engine,
llama.cpp's llama-simple.

The prediction rows alternate requests with and without the prediction on one engine (so a
machine whose load changes moves both alike) and report the median of each, the target steps
each took (deterministic but for the back-off's timing) and the drafts kept and rejected.

    python benchmarks/compare_speculation.py --threads 2 [--peer-bin DIR] [--n-gen 256]
        [--only lookup,draft,prediction,load,http]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ember.commands.bench import COPY_TASK, run_spec_bench
from ember.engine import Engine
from ember.hub.models import demo_model_path
from ember.sampling import SamplingParams

PEER_BIN = Path.home() / ".cache/ember-peer/llama.cpp/build/bin"

CODE = '''def load_inventory(path):
    """Reads the inventory file: one item per line, name, count and price separated by commas."""
    items = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(",")
            if len(parts) != 3:
                raise ValueError(f"line {number}: expected 3 fields, got {len(parts)}")
            name, count, price = parts
            items[name.strip()] = (int(count), float(price))
    return items


def total_value(items):
    """The value of everything in stock."""
    total = 0.0
    for count, price in items.values():
        total += count * price
    return total


def restock(items, name, amount):
    """Adds `amount` units of `name`; unknown items start at zero."""
    count, price = items.get(name, (0, 0.0))
    items[name] = (count + amount, price)
    return items[name][0]


def report(items):
    """One line per item, most valuable first."""
    lines = []
    for name, (count, price) in sorted(items.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
        lines.append(f"{name:20s} {count:6d} {price:10.2f} {count * price:12.2f}")
    return "\\n".join(lines)
'''
EDIT_TASK = ("Change the function restock so that it raises ValueError when amount is negative. "
             "Reply with the whole file and nothing else.\n\n```python\n" + CODE + "```")
# A second "change one line" request, one SmolLM2-135M carries out: asked for the edit above it
# rewrites the functions (141-246 of its tokens in common with the file, in five phrasings
# tried), while this settings file it copies with the new port (and two lines of its own, and a
# few lines past the end until max_tokens).
SETTINGS = '''"""Settings of the inventory service."""

HOST = "0.0.0.0"
PORT = 8080
DEBUG = False
LOG_LEVEL = "info"
LOG_FILE = "/var/log/inventory/service.log"
DATABASE_URL = "postgresql://inventory:secret@localhost:5432/inventory"
DATABASE_POOL_SIZE = 10
DATABASE_TIMEOUT_SECONDS = 30
CACHE_URL = "redis://localhost:6379/0"
CACHE_TTL_SECONDS = 300
MAX_UPLOAD_BYTES = 10485760
ALLOWED_ORIGINS = ["https://shop.example.com", "https://admin.example.com"]
SESSION_COOKIE_NAME = "inventory_session"
SESSION_LIFETIME_HOURS = 12
PASSWORD_MIN_LENGTH = 12
RATE_LIMIT_PER_MINUTE = 120
EMAIL_SENDER = "noreply@example.com"
EMAIL_SMTP_HOST = "smtp.example.com"
EMAIL_SMTP_PORT = 587
LOW_STOCK_THRESHOLD = 5
REPORT_CURRENCY = "EUR"
REPORT_TIMEZONE = "Europe/Berlin"
BACKUP_DIRECTORY = "/var/backups/inventory"
BACKUP_KEEP_DAYS = 14
FEATURE_BARCODE_SCANNER = True
FEATURE_SUPPLIER_PORTAL = False
FEATURE_AUTO_REORDER = True
AUTO_REORDER_QUANTITY = 50
'''
SETTINGS_TASK = ("```python\n" + SETTINGS + "```\n\nRewrite this file with PORT = 9090 instead of "
                 "PORT = 8080. Output the complete file.")


def peer(cmd: list[str]) -> dict:
    if not Path(cmd[0]).is_file():
        sys.exit(f"{cmd[0]} not found: build_llamacpp.sh builds llama-simple but not llama-lookup or "
                 "llama-speculative; in the peer's llama.cpp folder run `cmake --build build --target "
                 "llama-lookup llama-speculative`, or pass --peer-bin DIR")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    speed = re.findall(r"decoded\s+(\d+) tokens in\s+([\d.]+) s(?:econds)?, speed:\s+([\d.]+) t/s", text)
    if not speed:
        raise RuntimeError(f"{cmd[0]} printed no speed:\n{text[-3000:]}")
    n, _, tps = speed[-1]
    res = {"tokens": int(n), "tokens_per_second": float(tps)}
    for key in ("n_drafted", "n_accept"):
        m = re.search(rf"{key}\s*=\s*(\d+)", text)
        if m:
            res[key] = int(m.group(1))
    if "n_drafted" in res and res["n_drafted"]:
        res["acceptance"] = res["n_accept"] / res["n_drafted"]
    return res


def chat_text(model: Path, task: str) -> str:
    with Engine(model, parallel=1) as engine:
        return engine.chat_template.render([{"role": "user", "content": task}], True)


# Free writing: little of the answer is in the prompt, so n-gram drafts are mostly wrong and the
# back-off must keep them from costing the batch anything.
FREE_TOPICS = ["a lighthouse in winter", "the first day at a new school", "a dragon who hoards books",
               "a city on the ocean floor", "a robot learning to paint", "a lost umbrella",
               "the last train of the night", "a garden on Mars", "a cat who runs a bakery",
               "two rival chess players", "a storm over the mountains", "a letter never sent",
               "the oldest tree in the forest", "a detective who cannot see", "a festival of lanterns",
               "a map that redraws itself"]


def load_test(model: Path, threads: int, n_gen: int, free: bool, repetitions: int) -> dict:
    """16 concurrent requests: copy tasks (different passages' order), or with `free`, short
    stories on 16 topics; an engine without speculation and one with prompt lookup take turns,
    a batch each, `repetitions` times. The ratio is the median of the pairs'."""
    with Engine(model, n_threads=threads, parallel=16) as plain, \
            Engine(model, n_threads=threads, parallel=16, spec="ngram") as ngram:
        engines = {"none": plain, "ngram": ngram}
        tasks = ([f"Write a short story about {topic}." for topic in FREE_TOPICS] if free
                 else [f"({i}) " + COPY_TASK for i in range(16)])
        prompts = [plain.chat_template.encode(plain.tokenizer, [{"role": "user", "content": task}])
                   for task in tasks]
        speeds: dict[str, list[float]] = {"none": [], "ngram": []}
        n = 0
        for engine in engines.values():
            engine.generate_batch(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
        for _ in range(repetitions):
            for spec, engine in engines.items():
                start = time.perf_counter()
                results = engine.generate_batch(prompts, SamplingParams(temperature=0,
                                                                        max_tokens=n_gen))
                seconds = time.perf_counter() - start
                n = sum(len(r.tokens) for r in results)
                speeds[spec].append(n / seconds)
        time.sleep(0.05)
        stats = {spec: engine.stats() for spec, engine in engines.items()}
    row: dict = {"task": "free writing" if free else "copy", "tokens": n}
    for spec, st in stats.items():
        row[spec] = {"tokens_per_second": statistics.median(speeds[spec]),
                     "all_tokens_per_second": [round(x, 1) for x in speeds[spec]],
                     "drafted": sum(st.drafted_tokens.values()),
                     "accepted": sum(st.accepted_tokens.values()),
                     "step_fixed_s": st.step_fixed_s, "step_per_row_s": st.step_per_row_s}
    row["ratio"] = statistics.median(b / a for a, b in zip(speeds["none"], speeds["ngram"]))
    return row


def prediction_bench(model: Path, threads: int, task: str, prediction: str, n_gen: int,
                     repetitions: int) -> dict:
    """One engine; requests without and with `prediction` alternate, `repetitions` of each."""
    runs: dict[str, list[dict]] = {"none": [], "prediction": []}
    with Engine(model, n_threads=threads, parallel=1, prefix_caching=False) as engine:
        prompt = engine.chat_template.encode(engine.tokenizer, [{"role": "user", "content": task}])
        engine.submit(prompt, SamplingParams(temperature=0, max_tokens=8)).result()  # warm-up
        for _ in range(repetitions):
            for mode in ("none", "prediction"):
                steps = engine.stats().steps
                r = engine.submit(prompt, SamplingParams(
                    temperature=0, max_tokens=n_gen,
                    prediction=prediction if mode == "prediction" else None)).result()
                runs[mode].append({"tokens": len(r.tokens), "text": r.text,
                                   "tokens_per_second": len(r.tokens) / (r.timings.generation_ms / 1e3),
                                   "steps": engine.stats().steps - steps,
                                   "accepted": r.usage.accepted_prediction_tokens or 0,
                                   "rejected": r.usage.rejected_prediction_tokens or 0})
    assert runs["none"][0]["text"] == runs["prediction"][0]["text"], "speculation changed the output"
    out: dict = {"prompt_tokens": len(prompt), "output_tokens": runs["none"][0]["tokens"]}
    for mode, rows in runs.items():
        out[mode] = {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in rows),
                     "all_tokens_per_second": [round(r["tokens_per_second"], 2) for r in rows],
                     "steps": statistics.median(r["steps"] for r in rows),
                     "accepted": sum(r["accepted"] for r in rows) // len(rows),
                     "rejected": sum(r["rejected"] for r in rows) // len(rows)}
    out["speedup"] = out["prediction"]["tokens_per_second"] / out["none"]["tokens_per_second"]
    out["answer"] = runs["none"][0]["text"]
    return out


def http_load(model: Path, threads: int, n_gen: int, spec: str) -> dict:
    """`ember serve --parallel 16 --spec SPEC` and 16 streaming clients (serve_bench's), each
    sending one copy-task request (different passages' order)."""
    import serve_bench

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-c", "from ember.cli import main; main()", "serve", str(model),
           "--parallel", "16", "--threads", str(threads), "--port", str(port), "--host",
           "127.0.0.1", "--spec", spec]
    url = f"http://127.0.0.1:{port}"
    with serve_bench.running_server(cmd, url):
        args = argparse.Namespace(url=url + "/v1", model="", api_key="", requests=16,
                                  max_tokens=n_gen, temperature=0.0, ignore_eos_ids=[],
                                  timeout=1800.0)
        prompts = [f"({i}) " + COPY_TASK for i in range(16)]
        level = asyncio.run(serve_bench.run_level(args, 16, prompts))
        metrics = httpx.get(url + "/metrics", timeout=10).text

    def total(name: str) -> int:
        return sum(int(float(v)) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", metrics, re.M))

    return {"spec": spec, "requests": level.n_requests, "errors": level.n_errors,
            "tokens_per_second": level.output_tokens_per_s,
            "tpot_ms_p50": level.tpot_ms["p50"], "drafted": total("ember_spec_draft_tokens_total"),
            "accepted": total("ember_spec_accepted_tokens_total")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-gen", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--peer-bin", type=Path, default=PEER_BIN)
    parser.add_argument("--only", default="lookup,draft,prediction,load,http")
    args = parser.parse_args()
    only = set(args.only.split(","))
    smol = demo_model_path(quiet=True)
    bin_ = args.peer_bin
    t = str(args.threads)
    report: dict = {}

    if "lookup" in only:
        prompt = chat_text(smol, COPY_TASK)
        report["lookup"] = {
            "ember": run_spec_bench(smol, args.n_gen, args.threads, args.repetitions, "ngram",
                                    None, 16),
            "llama.cpp plain": peer([str(bin_ / "llama-simple"), "-m", str(smol), "-n",
                                     str(args.n_gen), prompt]),
            "llama.cpp lookup": peer([str(bin_ / "llama-lookup"), "-m", str(smol), "-t", t,
                                      "-n", str(args.n_gen), "--temp", "0", "--spec-draft-n-max", "16",
                                      "-p", prompt]),
        }
        print(json.dumps(report["lookup"], indent=1), flush=True)
    if "draft" in only:
        with tempfile.TemporaryDirectory() as tmp:
            from dequantize_gguf import dequantize_file

            f16 = Path(tmp) / "smollm2-f16.gguf"
            dequantize_file(smol, f16)
            prompt = chat_text(f16, COPY_TASK)
            report["draft"] = {
                "ember": run_spec_bench(f16, args.n_gen, args.threads, args.repetitions, "draft",
                                        smol, 16),
                # Free writing, where little of the answer repeats the text before it (so staged
                # drafting's lookahead rarely saves a draft pass).
                "ember, free writing": run_spec_bench(
                    f16, 200, args.threads, args.repetitions, "draft", smol, 16,
                    task="Write a short story about " + FREE_TOPICS[0] + "."),
                "llama.cpp plain": peer([str(bin_ / "llama-simple"), "-m", str(f16), "-n",
                                         str(args.n_gen), prompt]),
                "llama.cpp speculative": peer([
                    str(bin_ / "llama-speculative"), "-m", str(f16), "-md", str(smol), "-t", t,
                    "-td", t, "-n", str(args.n_gen), "--temp", "0", "--spec-draft-n-max", "16",
                    "-p", prompt]),
            }
        print(json.dumps(report["draft"], indent=1), flush=True)
    if "prediction" in only:
        prompt = chat_text(smol, EDIT_TASK)
        original = prediction_bench(smol, args.threads, EDIT_TASK, CODE, 450, args.repetitions)
        # The same request when the prediction is right but for one line: the model's own answer
        # with its restock line changed back to the original's.
        answer = original.pop("answer")
        edited = answer.replace("    return items[name][0]", "    return items[name][0] + 0", 1)
        settings_prompt = chat_text(smol, SETTINGS_TASK)
        settings = prediction_bench(smol, args.threads, SETTINGS_TASK, SETTINGS, 450, args.repetitions)
        settings["answer_tail"] = settings.pop("answer")[-200:]
        report["prediction"] = {
            "ember, prediction = the original file": original,
            "ember, prediction = the answer with one line changed": {
                k: v for k, v in prediction_bench(smol, args.threads, EDIT_TASK, edited, 450,
                                                  args.repetitions).items() if k != "answer"},
            "llama.cpp plain": peer([str(bin_ / "llama-simple"), "-m", str(smol), "-n", "450",
                                     prompt]),
            "llama.cpp lookup": peer([str(bin_ / "llama-lookup"), "-m", str(smol), "-t", t,
                                      "-n", "450", "--temp", "0", "--spec-draft-n-max", "16",
                                      "-p", prompt]),
            "ember, settings file, prediction = the original file": settings,
            "llama.cpp lookup, settings file": peer([
                str(bin_ / "llama-lookup"), "-m", str(smol), "-t", t, "-n", "450", "--temp", "0",
                "--spec-draft-n-max", "16", "-p", settings_prompt]),
        }
        print(json.dumps(report["prediction"], indent=1), flush=True)
    if "load" in only:
        report["load"] = [load_test(smol, args.threads, 128, free, args.repetitions)
                          for free in (False, True)]
        print(json.dumps(report["load"], indent=1), flush=True)
    if "http" in only:
        report["http"] = [http_load(smol, args.threads, 96, s) for s in ("none", "ngram")]
        print(json.dumps(report["http"], indent=1), flush=True)


if __name__ == "__main__":
    main()
