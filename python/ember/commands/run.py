"""`ember run [MODEL] -p PROMPT`: one generation, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from ember.commands import generation_options as opt
from ember.grammar import Constraint

_D = opt.DEFAULTS


def run(
    model: opt.ModelArg = None,
    prompt: opt.Prompt = None,
    chat: Annotated[bool, typer.Option(
        "--chat", help="send the prompt as a user message in the model's chat template")] = False,
    system: opt.System = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print one JSON object (text, finish_reason, usage, timings)")] = False,
    max_tokens: opt.MaxTokens = None,
    temp: opt.Temp = _D["temp"],
    top_k: opt.TopK = _D["top_k"],
    top_p: opt.TopP = _D["top_p"],
    min_p: opt.MinP = _D["min_p"],
    typical_p: opt.TypicalP = _D["typical_p"],
    repeat_penalty: opt.RepeatPenalty = _D["repeat_penalty"],
    repeat_last_n: opt.RepeatLastN = _D["repeat_last_n"],
    presence_penalty: opt.PresencePenalty = _D["presence_penalty"],
    frequency_penalty: opt.FrequencyPenalty = _D["frequency_penalty"],
    seed: opt.Seed = None,
    stop: opt.Stop = None,
    threads: opt.Threads = None,
    device: opt.Device = None,
    ctx_size: opt.CtxSize = None,
    spec: opt.Spec = "none",
    draft_model: opt.DraftModel = None,
    draft_max: opt.DraftMax = 16,
    draft_min: opt.DraftMin = 1,
    prediction: opt.Prediction = None,
    chat_template: opt.ChatTemplateOpt = None,
    json_schema: Annotated[Optional[Path], typer.Option(
        "--json-schema", help="a JSON Schema file: the output is JSON that matches it")] = None,
    grammar: Annotated[Optional[Path], typer.Option(
        "--grammar", help="a GBNF grammar file (llama.cpp's format): the output matches it")] = None,
) -> None:
    """Generate text from a prompt, streaming it to stdout."""
    if prompt is None:
        raise ValueError("no prompt: pass -p TEXT, or -p - to read it from stdin")
    if prompt == "-":
        prompt = sys.stdin.read().removesuffix("\n")  # the newline `echo` adds is not prompt
    if system is not None and not chat:
        raise ValueError("--system needs --chat")
    params = opt.sampling_params(
        temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
        max_tokens=max_tokens, stop=stop)
    constraint = _constraint(json_schema, grammar)
    if constraint is not None:
        params = replace(params, constraint=constraint)
    params.prediction = opt.prediction_text(prediction)
    llm = opt.load_llm(model, threads, ctx_size, spec=spec, draft_model=draft_model,
                       draft_max=draft_max, draft_min=draft_min, device=device,
                       chat_template=chat_template)
    if chat:
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        deltas = llm.chat_deltas([*messages, {"role": "user", "content": prompt}], params)
    else:
        deltas = llm.stream_deltas(prompt, params)

    result = None
    for delta in deltas:
        if not as_json and delta.text:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        if delta.result is not None:
            result = delta.result
    assert result is not None  # the last delta always carries it
    if as_json:
        out = {"text": result.text, "finish_reason": result.finish_reason,
               "tokens": result.tokens,
               "usage": {k: v for k, v in asdict(result.usage).items() if v is not None},
               "timings": asdict(result.timings)}
        typer.echo(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()


def _constraint(json_schema: Path | None, grammar: Path | None) -> Constraint | None:
    if json_schema is not None and grammar is not None:
        raise ValueError("give --json-schema or --grammar, not both")
    path = json_schema or grammar
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if json_schema is not None:
        try:
            return Constraint.json_schema(json.loads(text))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON: {err}") from None
    return Constraint.gbnf(text)


def register(app: typer.Typer) -> None:
    app.command(cls=opt.OneLineErrors)(run)
