"""`ember run [MODEL] -p PROMPT`: one generation, streamed to stdout (or one JSON object)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from ember.commands import generation_options as opt
from ember.context_fit import check_policy
from ember.grammar import Constraint
from ember.options import EngineOptions
from ember.sampling import SamplingParams


@opt.with_generation_flags
def run(
    model: opt.ModelArg = None,
    prompt: opt.Prompt = None,
    chat: Annotated[bool, typer.Option(
        "--chat", help="send the prompt as a user message in the model's chat template")] = False,
    system: opt.System = None,
    image: Annotated[Optional[list[Path]], typer.Option(
        "--image", help="an image file (PNG, JPEG, WebP, GIF, BMP) for the prompt, placed before "
        "its text; repeatable; implies --chat and needs a vision model (--mmproj)",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print one JSON object (text, finish_reason, usage, timings)")] = False,
    *,
    params: SamplingParams,
    options: EngineOptions,
    prediction: opt.Prediction = None,
    chat_template: opt.ChatTemplateOpt = None,
    context_overflow: opt.ContextOverflow = "error",
    json_schema: Annotated[Optional[Path], typer.Option(
        "--json-schema", help="a JSON Schema file: the output is JSON that matches it")] = None,
    grammar: Annotated[Optional[Path], typer.Option(
        "--grammar", help="a GBNF grammar file (llama.cpp's format): the output matches it")] = None,
    lora: Annotated[Optional[Path], typer.Option(
        "--lora", help="a LoRA adapter .gguf of the model (ember convert --lora) to run with")] = None,
    lora_scale: Annotated[float, typer.Option(
        "--lora-scale", help="the factor on the adapter's product (alpha / rank comes on top)")] = 1.0,
) -> None:
    """Generate text from a prompt, streaming it to stdout."""
    if prompt is None:
        raise ValueError("no prompt: pass -p TEXT, or -p - to read it from stdin")
    if prompt == "-":
        prompt = sys.stdin.read().removesuffix("\n")  # the newline `echo` adds is not prompt
    images = image or []
    chat = chat or bool(images)
    if system is not None and not chat:
        raise ValueError("--system needs --chat")
    for path in images:  # before the model loads
        if not path.is_file():
            raise ValueError(f"--image {path}: no such file")
    constraint = _constraint(json_schema, grammar)
    if constraint is not None:
        params = replace(params, constraint=constraint)
    params.prediction = opt.prediction_text(prediction)
    if lora is not None:
        params = replace(params, lora=lora.stem, lora_scale=lora_scale)
    llm = opt.load_llm(model, options, chat_template, check_policy(context_overflow, "--context-overflow"),
                       {lora.stem: lora} if lora else None)
    if chat:
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        deltas = llm.chat_deltas([*messages, {"role": "user", "content": prompt}], params,
                                 images=images)
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
               "usage": {k: v for k, v in asdict(result.usage).items()
                         if v is not None and not (k.startswith("dropped_") and v == 0)},
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
