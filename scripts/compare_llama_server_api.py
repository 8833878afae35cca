"""Compares ember's answers with llama-server's on the same model, endpoint by endpoint and field
by field: the status each gives, the JSON fields one has that the other lacks, the greedy texts,
and, for ember, that no input (malformed included) is answered with a 5xx or a traceback.

    llama-server -m MODEL.gguf --port 18181 -c 512 -np 1 -t 1 --metrics &
    ember serve MODEL.gguf --port 18182 --ctx-size 512 --parallel 1 --threads 1 &
    python scripts/compare_llama_server_api.py --llama http://127.0.0.1:18181 \\
        --ember http://127.0.0.1:18182 [--markdown table.md]

The endpoints and fields are those of llama-server's tools/server/README.md; every request runs
greedy (temperature 0) with a few tokens so the texts can be compared. The table it writes is
the body of docs/llama-server-compat.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "n_predict": 4}
OAI = {"temperature": 0, "max_tokens": 4}
LONG = "Once upon a time " * 200  # over a 512-token context


@dataclass
class Case:
    endpoint: str           # "POST /completion"
    what: str               # the field or shape under test
    body: Any = None        # JSON body (a str is sent as raw bytes)
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.endpoint.split()[0]

    @property
    def path(self) -> str:
        return self.endpoint.split()[1]


def _label(fields: dict[str, Any]) -> str:
    return ", ".join(f"`{k}`: {json.dumps(v)}" for k, v in fields.items())


def completion_field(name: str, value: Any, **extra: Any) -> Case:
    return Case("POST /completion", _label({name: value, **extra}),
                {"prompt": PROMPT, **GREEDY, name: value, **extra})


def chat_field(name: str, value: Any, **extra: Any) -> Case:
    return Case("POST /v1/chat/completions", _label({name: value, **extra}),
                {"messages": CHAT, **OAI, name: value, **extra})


def cases() -> list[Case]:
    out = [
        Case("GET /health", "ready"),
        Case("POST /completion", "text prompt", {"prompt": PROMPT, **GREEDY}),
        Case("POST /completion", "stream", {"prompt": PROMPT, **GREEDY}, stream=True),
        Case("POST /completion", "token-id prompt", {"prompt": [1, 2, 3], **GREEDY}),
        Case("POST /completion", "mixed prompt", {"prompt": [1, "upon a time"], **GREEDY}),
        Case("POST /completion", "several prompts", {"prompt": [PROMPT, "Hello"], **GREEDY}),
        Case("POST /completion", "prompt_string object", {"prompt": {"prompt_string": PROMPT},
                                                          **GREEDY}),
        Case("POST /completions", "alias of /completion", {"prompt": PROMPT, **GREEDY}),
        Case("POST /completion", "prompt over the context", {"prompt": LONG, **GREEDY}),
        Case("POST /completion", "missing prompt", {"n_predict": 2}),
        Case("POST /completion", "malformed JSON", "{\"prompt\": "),
        Case("POST /completion", "body not an object", "[1, 2]"),
    ]
    # /completion's options (README "POST /completion"), each set to a value that changes it.
    for name, value, extra in [
        ("temperature", 0.7, {"seed": 1}), ("dynatemp_range", 0.5, {}),
        ("dynatemp_exponent", 2.0, {}), ("top_k", 5, {}), ("top_p", 0.5, {}),
        ("min_p", 0.2, {}), ("n_predict", 2, {}), ("n_predict", 0, {}), ("n_predict", -1, {}),
        ("n_indent", 2, {}), ("n_keep", 4, {}), ("n_cmpl", 2, {}), ("n_cache_reuse", 16, {}),
        ("stop", [" time"], {}), ("stop", "\n", {}), ("typical_p", 0.5, {}),
        ("repeat_penalty", 1.3, {}), ("repeat_last_n", 16, {}), ("presence_penalty", 0.5, {}),
        ("frequency_penalty", 0.5, {}), ("dry_multiplier", 0.8, {}), ("dry_base", 2.0, {}),
        ("dry_allowed_length", 3, {}), ("dry_penalty_last_n", 32, {}),
        ("dry_sequence_breakers", ["\n"], {}), ("xtc_probability", 0.5, {}),
        ("xtc_threshold", 0.2, {}), ("mirostat", 2, {}), ("mirostat_tau", 4.0, {}),
        ("mirostat_eta", 0.2, {}), ("grammar", 'root ::= "yes" | "no"', {}),
        ("json_schema", {"type": "boolean"}, {}), ("seed", 42, {"temperature": 0.8}),
        ("seed", -1, {}), ("ignore_eos", True, {}),
        # Token 28 is SmolLM2's ",", the clear greedy choice after PROMPT (no near-tie).
        ("logit_bias", [[28, 1.0]], {}), ("logit_bias", [[28, False]], {}),
        ("logit_bias", [[",", False]], {}), ("logit_bias", [["Hello", -0.5]], {}),
        ("logit_bias", {"28": 5}, {}), ("logit_bias", {",": -20}, {}),
        ("logit_bias", {"28": False}, {}), ("logit_bias", [[28, False], [281, 3]], {}),
        ("n_probs", 2, {}), ("n_probs", 2, {"post_sampling_probs": True}),
        ("min_keep", 2, {}), ("t_max_predict_ms", 500, {}), ("id_slot", 0, {}),
        ("id_slot", 5, {}), ("cache_prompt", False, {}), ("return_tokens", True, {}),
        ("samplers", ["top_k", "temperature"], {}), ("samplers", "kt", {}),
        ("samplers", ["temperature", "top_k"], {}), ("timings_per_token", True, {}),
        ("return_progress", True, {}), ("sse_ping_interval", 5, {}),
        ("post_sampling_probs", True, {}), ("response_fields", ["content"], {}),
        ("lora", [{"id": 0, "scale": 0.5}], {}), ("lora", [], {}), ("top_n_sigma", 1.0, {}),
        ("adaptive_target", 0.5, {}), ("backend_sampling", True, {}),
        ("verbose", True, {}), ("n_discard", 8, {}), ("typical_p", "x", {}),
        ("temperature", -1, {}), ("top_k", "five", {}), ("logit_bias", "x", {}),
        ("stop", [1, 2], {}), ("n_predict", -5, {}),
    ]:
        out.append(completion_field(name, value, **extra))
    for name in ("timings_per_token", "return_progress"):
        out.append(Case("POST /completion", f"`{name}`: true, stream",
                        {"prompt": PROMPT, **GREEDY, name: True}, stream=True))
    out.append(Case("POST /completion", "`n_probs`: 2, `post_sampling_probs`: true, stream",
                    {"prompt": PROMPT, **GREEDY, "n_probs": 2, "post_sampling_probs": True},
                    stream=True))
    out += [
        Case("POST /tokenize", "`content`", {"content": PROMPT}),
        Case("POST /tokenize", "`add_special`: true", {"content": PROMPT, "add_special": True}),
        Case("POST /tokenize", "`parse_special`: false",
             {"content": "<|im_start|>hi", "parse_special": False}),
        Case("POST /tokenize", "`with_pieces`: true", {"content": PROMPT, "with_pieces": True}),
        Case("POST /tokenize", "missing content", {}),
        Case("POST /detokenize", "`tokens`", {"tokens": [1, 2, 3, 28]}),
        Case("POST /detokenize", "out-of-range id", {"tokens": [10**9]}),
        Case("POST /apply-template", "`messages`", {"messages": CHAT}),
        Case("POST /apply-template", "text parts",
             {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                        {"type": "text", "text": "there"}]}]}),
        Case("POST /embedding", "on a generation model", {"content": PROMPT}),
        Case("POST /embeddings", "on a generation model", {"content": PROMPT}),
        Case("POST /v1/embeddings", "on a generation model", {"input": PROMPT}),
        Case("POST /reranking", "on a generation model", {"query": "a", "documents": ["b"]}),
        Case("POST /rerank", "on a generation model", {"query": "a", "documents": ["b"]}),
        Case("POST /infill", "`input_prefix`, `input_suffix`",
             {"input_prefix": "def f(", "input_suffix": "):\n", **GREEDY}),
        Case("GET /props", "global properties"),
        Case("POST /props", "change properties", {"n_ctx": 1024}),
        Case("GET /slots", "slots"),
        Case("GET /slots?fail_on_no_slot=1", "`fail_on_no_slot`"),
        Case("POST /slots/0?action=save", "save", {"filename": "slot0.bin"}),
        Case("POST /slots/0?action=restore", "restore", {"filename": "slot0.bin"}),
        Case("POST /slots/0?action=erase", "erase"),
        Case("GET /metrics", "Prometheus text"),
        Case("GET /lora-adapters", "list"),
        Case("POST /lora-adapters", "set", [{"id": 0, "scale": 0.5}]),
        Case("GET /v1/models", "list"),
        Case("GET /models", "list (router mode in llama-server)"),
        Case("POST /v1/completions", "text prompt", {"prompt": PROMPT, **OAI}),
        Case("POST /v1/completions", "stream", {"prompt": PROMPT, **OAI}, stream=True),
        Case("POST /v1/completions", "`logprobs`: 2", {"prompt": PROMPT, **OAI, "logprobs": 2}),
        Case("POST /v1/completions", "`echo`: true", {"prompt": PROMPT, **OAI, "echo": True}),
        Case("POST /v1/completions", "`logit_bias` object", {"prompt": PROMPT, **OAI,
                                                              "logit_bias": {"28": -100}}),
        Case("POST /v1/completions", "`logit_bias` array, text, false",
             {"prompt": PROMPT, **OAI, "logit_bias": [[",", False]]}),
        Case("POST /v1/completions", "prompt over the context", {"prompt": LONG, **OAI}),
        Case("POST /v1/chat/completions", "messages", {"messages": CHAT, **OAI}),
        Case("POST /v1/chat/completions", "stream", {"messages": CHAT, **OAI}, stream=True),
        Case("POST /v1/chat/completions", "stream, `include_usage`",
             {"messages": CHAT, **OAI, "stream_options": {"include_usage": True}}, stream=True),
        Case("POST /v1/chat/completions", "prefill (trailing assistant message)",
             {"messages": [*CHAT, {"role": "assistant", "content": "The capital of France is"}],
              **OAI}),
        Case("POST /v1/chat/completions", "prompt over the context",
             {"messages": [{"role": "user", "content": LONG}], **OAI}),
    ]
    for name, value, extra in [
        ("logprobs", True, {"top_logprobs": 2}), ("response_format", {"type": "json_object"}, {}),
        ("response_format", {"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "boolean"}}}, {}),
        ("n", 2, {}), ("seed", 3, {"temperature": 0.8}), ("stop", ["Paris"], {}),
        ("logit_bias", {"The": -100}, {}), ("logit_bias", [["The", False]], {}),
        ("max_completion_tokens", 3, {}), ("presence_penalty", 0.5, {}),
        ("tools", [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}], {}),
        ("tool_choice", "none", {}), ("parallel_tool_calls", False, {}),
        ("post_sampling_probs", True, {"logprobs": True, "top_logprobs": 2}),
        ("timings_per_token", True, {}), ("return_progress", True, {}),
        ("cache_prompt", False, {}), ("n_probs", 2, {}), ("chat_template_kwargs", {}, {}),
        ("reasoning_format", "none", {}), ("add_generation_prompt", False, {}),
        ("continue_final_message", True, {}), ("grammar", 'root ::= "yes"', {}),
        ("temperature", "hot", {}), ("messages", "Hi", {}),
    ]:
        out.append(chat_field(name, value, **extra))
    for name in ("timings_per_token", "return_progress"):
        out.append(Case("POST /v1/chat/completions", f"`{name}`: true, stream",
                        {"messages": CHAT, **OAI, name: True}, stream=True))
    out += [
        Case("POST /v1/chat/completions/control", "`reasoning_end` on a finished id",
             {"id": "chatcmpl-none", "action": "reasoning_end"}),
        Case("POST /v1/chat/completions/input_tokens", "count", {"messages": CHAT}),
        Case("POST /v1/responses", "input", {"model": "x", "input": "Hi",
                                             "max_output_tokens": 4, "temperature": 0}),
        Case("POST /v1/responses", "stream", {"model": "x", "input": "Hi",
                                              "max_output_tokens": 4, "temperature": 0},
             stream=True),
        Case("POST /v1/responses/input_tokens", "count", {"model": "x", "input": "Hi"}),
        Case("POST /v1/messages", "messages", {"model": "x", "max_tokens": 4, "temperature": 0,
                                               "messages": [{"role": "user", "content": "Hi"}]}),
        Case("POST /v1/messages", "stream", {"model": "x", "max_tokens": 4, "temperature": 0,
                                             "messages": [{"role": "user", "content": "Hi"}]},
             stream=True),
        Case("POST /v1/messages/count_tokens", "count",
             {"model": "x", "messages": [{"role": "user", "content": "Hi"}]}),
        Case("POST /models/load", "router mode only", {"model": "x"}),
        Case("GET /nonexistent", "unknown route"),
    ]
    return out


# --- running and comparing ------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    body: Any = None         # parsed JSON (a list of events for a stream), or the text
    error: str = ""          # a transport failure


def ask(base: str, case: Case) -> Answer:
    kwargs: dict[str, Any] = {"timeout": 120, "headers": dict(case.headers)}
    if isinstance(case.body, str):
        kwargs["content"] = case.body.encode()
        kwargs["headers"]["content-type"] = "application/json"
    elif case.body is not None:
        kwargs["json"] = {**case.body, "stream": True} if case.stream else case.body
    try:
        if case.stream:
            with httpx.stream(case.method, base + case.path, **kwargs) as response:
                lines = list(response.iter_lines())
                if response.status_code != 200:
                    return Answer(response.status_code, _json("\n".join(lines)))
                return Answer(200, [_json(line[6:]) for line in lines
                                    if line.startswith("data: {")])
        response = httpx.request(case.method, base + case.path, **kwargs)
    except httpx.HTTPError as err:
        return Answer(0, error=f"{type(err).__name__}: {err}")
    return Answer(response.status_code, _json(response.text))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def keys(value: Any, prefix: str = "") -> set[str]:
    """Every field path of a JSON value: objects' keys, a list's items merged as `[]`."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(prefix + k)
            out |= keys(v, prefix + k + ".")
    elif isinstance(value, list):
        for item in value[:4]:
            out |= keys(item, prefix + "[].")
    return out


def _text(case: Case, answer: Answer) -> str | None:
    """The generated text of a greedy answer, when it has one."""
    body = answer.body
    if answer.status != 200:
        return None
    if case.stream and isinstance(body, list):
        parts = []
        for e in body:
            if isinstance(e.get("content"), str):
                parts.append(e["content"])
            for c in e.get("choices") or []:
                parts.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        return "".join(parts)
    if isinstance(body, dict):
        if isinstance(body.get("content"), str):
            return body["content"]
        choices = body.get("choices")
        if isinstance(choices, list) and choices:
            c = choices[0]
            return c.get("text") if "text" in c else (c.get("message") or {}).get("content")
    return None


def _error(answer: Answer) -> str:
    body = answer.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        return "/".join(str(e.get(k)) for k in ("type", "code", "param") if e.get(k) is not None)
    return ""


def _status(answer: Answer) -> str:
    if answer.status == 0:
        return f"no answer ({answer.error[:40]})"
    error = _error(answer)
    return f"{answer.status} {error}" if error else str(answer.status)


def _shape(case: Case, answer: Answer) -> Any:
    """The part whose fields are compared: a stream's first and last events; an array's first
    item."""
    body = answer.body
    if isinstance(body, list) and body and all(isinstance(e, dict) for e in body):
        if case.stream:
            return {"first event": body[0], "last event": body[-1]}
        return {"[]": body[0]}
    return body


def _short(names: set[str], n: int = 6) -> str:
    shown = sorted(names, key=lambda k: (k.count("."), k))[:n]
    more = f" +{len(names) - n}" if len(names) > n else ""
    return ", ".join(f"`{k}`" for k in shown) + more


def _probs(answer: Answer) -> list[tuple[int, float]]:
    """(id, value) of the first entry's alternatives in completion_probabilities."""
    body = answer.body
    if not isinstance(body, dict) or not body.get("completion_probabilities"):
        return []
    first = body["completion_probabilities"][0]
    top = first.get("top_probs") or first.get("top_logprobs") or []
    return [(t["id"], t.get("prob", t.get("logprob"))) for t in top]


def compare(case: Case, llama: Answer, ember: Answer) -> str:
    notes = []
    if llama.status == ember.status == 200:
        # The parameter echo (generation_settings) differs alike in every /completion row:
        # shown once, in the "text prompt" row.
        ignore = () if case.what == "text prompt" else ("generation_settings",
                                                        "last event.generation_settings")
        a, b = (k for k in (keys(_shape(case, x)) for x in (llama, ember)))
        a = {k for k in a if not k.startswith(ignore)}
        b = {k for k in b if not k.startswith(ignore)}
        if a - b:
            notes.append("only llama-server: " + _short(a - b))
        if b - a:
            notes.append("only ember: " + _short(b - a))
        ta, tb = _text(case, llama), _text(case, ember)
        if ta is not None and tb is not None:
            notes.append("same text" if ta == tb else f"text {ta[:30]!r} vs {tb[:30]!r}")
        pa, pb = _probs(llama), _probs(ember)
        if pa and pb:
            same = [i for i, _ in pa] == [i for i, _ in pb]
            delta = max(abs(x - y) for (_, x), (_, y) in zip(pa, pb))
            notes.append(f"{'same' if same else 'different'} top ids, values within {delta:.3f}")
    # 501 (a capability the server lacks) and 503 (busy, loading) are answers, not failures.
    failed = ember.status >= 500 and ember.status not in (501, 503)
    if failed or (isinstance(ember.body, str) and "Traceback" in ember.body):
        notes.append("**ember 5xx/traceback**")
    return "; ".join(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama", required=True, help="llama-server's base URL")
    parser.add_argument("--ember", required=True, help="ember serve's base URL")
    parser.add_argument("--markdown", help="write the table to this file")
    args = parser.parse_args()
    rows = ["| endpoint | case | llama-server | ember | differences |", "|---|---|---|---|---|"]
    bad = 0
    for case in cases():
        llama, ember = ask(args.llama.rstrip("/"), case), ask(args.ember.rstrip("/"), case)
        note = compare(case, llama, ember)
        bad += "5xx" in note
        what = case.what.replace("|", "\\|")
        rows.append(f"| `{case.endpoint}` | {what} | {_status(llama)} | {_status(ember)} "
                    f"| {note} |")
        print(rows[-1], flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(rows) + "\n")
    if bad:
        print(f"{bad} case(s) got a 5xx or a traceback from ember", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
