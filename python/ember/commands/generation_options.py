"""Command-line options shared by `ember run` and `ember chat`: the model, threads, context and
sampling flags, with llama.cpp's flag names where it has them. Their defaults are the C++ ones
(SamplingParams, EngineOptions); with_generation_flags gives a command all of them at once."""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TextIO

import typer
import typer.core

from ember.options import DEFAULTS as _E
from ember.options import EngineOptions, engine_options
from ember.sampling import SamplingParams

if TYPE_CHECKING:
    from ember.llm import LLM

_D = SamplingParams()


# click's UsageError (bad value, unknown flag, missing argument). Recent typer versions ship
# their own copy of click, so the class is found through typer's public BadParameter.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class OneLineErrors(typer.core.TyperCommand):
    """Bad flags and values raise ValueError, which ember.cli.main prints as one `error:` line
    (click would print the usage and a boxed message)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERROR as err:
            raise ValueError(err.format_message()) from None

ModelArg = Annotated[Optional[str], typer.Argument(
    help="a .gguf file or hf://USER/REPO[:QUANT] (default: the demo model, "
         "SmolLM2-135M-Instruct)", show_default=False)]
# Module-level aliases keep Optional: typer evaluates these at run time, also on Python 3.9.
Prompt = Annotated[Optional[str], typer.Option(
    "-p", "--prompt", help="the prompt; '-' reads it from stdin", show_default=False)]
Threads = Annotated[Optional[int], typer.Option(
    "-t", "--threads", help="CPU threads \\[default: physical cores]", show_default=False)]
Device = Annotated[Optional[str], typer.Option(
    "--device", help=("device to run on: cpu, cuda, cuda:N, vulkan or vulkan:N "
                      "\\[default: $EMBER_DEVICE, else the first GPU, else the CPU]"),
    show_default=False)]
CtxSize = Annotated[Optional[int], typer.Option(
    "-c", "--ctx-size", help=("context size in tokens \\[default: the model's, at most "
                              f"{EngineOptions.default_max_ctx}]"),
    show_default=False)]
MaxTokens = Annotated[Optional[int], typer.Option(
    "-n", "--max-tokens", help="most tokens to generate \\[default: until the model stops]",
    show_default=False)]
Temp = Annotated[float, typer.Option("--temp", "--temperature", help="temperature; 0 is greedy")]
TopK = Annotated[int, typer.Option("--top-k", help="keep the k most likely tokens; 0: off")]
TopP = Annotated[float, typer.Option("--top-p", help="nucleus sampling; 1: off")]
MinP = Annotated[float, typer.Option("--min-p", help="drop tokens below min_p * p_max; 0: off")]
TypicalP = Annotated[float, typer.Option("--typical", "--typical-p", help="typical sampling; 1: off")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty", help="1: off")]
RepeatLastN = Annotated[int, typer.Option(
    "--repeat-last-n", help="tokens the penalties look back over; -1: all")]
PresencePenalty = Annotated[float, typer.Option("--presence-penalty")]
FrequencyPenalty = Annotated[float, typer.Option("--frequency-penalty")]
Seed = Annotated[Optional[int], typer.Option(
    "-s", "--seed", help="random seed; the same seed gives the same text \\[default: random]",
    show_default=False)]
Stop = Annotated[Optional[list[str]], typer.Option(
    "--stop", help="stop before this text (repeatable)", show_default=False)]
Spec = Annotated[str, typer.Option(
    "--spec", help="speculative decoding (same output, sooner): 'none', 'ngram' (drafts from the "
                   "prompt and output so far) or 'draft' (from --draft-model)")]
DraftModel = Annotated[Optional[str], typer.Option(
    "--draft-model", help="a small .gguf with the model's vocabulary that drafts tokens "
                          "(implies --spec draft)", show_default=False)]
DraftMax = Annotated[int, typer.Option("--draft-max", help="drafts per step at most")]
DraftMin = Annotated[int, typer.Option(
    "--draft-min", help="fewer drafts than this would not pay: none")]
Prediction = Annotated[Optional[str], typer.Option(
    "--prediction", help="the expected output (Predicted Outputs): text, or @FILE; drafts "
                         "come from it", show_default=False)]
System = Annotated[Optional[str], typer.Option("--system", help="a system message for the chat")]
MMPROJ_HELP = ("the model's vision projector (an mmproj .gguf, as llama.cpp's --mmproj): the model "
               "then takes images")
Mmproj = Annotated[Optional[Path], typer.Option("--mmproj", help=MMPROJ_HELP, show_default=False)]
CHAT_TEMPLATE_HELP = ("NAME of a built-in template (chatml, gemma, llama3) or a Jinja FILE, instead "
                      "of the model's \\[default: the model's, else its architecture's, else chatml]")
ChatTemplateOpt = Annotated[Optional[str], typer.Option(
    "--chat-template", help=CHAT_TEMPLATE_HELP, show_default=False)]
CONTEXT_OVERFLOW_HELP = (
    "a prompt that, with the room kept for its answer (max_tokens, at most half the context; "
    "else a quarter of it), does not fit the context: 'error' refuses it (when longer than the "
    "context itself); 'shift' drops a chat's oldest whole turns, keeping the system prompt, "
    "the tools and the latest user message, and cuts the middle of what still does not fit; "
    "'truncate-middle' keeps the prompt's first and last tokens and drops the middle (half "
    "the room from the start, or a request's n_keep tokens; the rest from the end)")
ContextOverflow = Annotated[str, typer.Option("--context-overflow", help=CONTEXT_OVERFLOW_HELP)]


def sampling_params(*, temp: float, top_k: int, top_p: float, min_p: float, typical_p: float,
                    repeat_penalty: float, repeat_last_n: int, presence_penalty: float,
                    frequency_penalty: float, seed: int | None, max_tokens: int | None,
                    stop: list[str] | None) -> SamplingParams:
    """The flags as SamplingParams, checked now (before the model loads) so a bad value fails
    fast with one line."""
    params = SamplingParams(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
        max_tokens=max_tokens, stop=list(stop or []),
    )
    params.check(1)  # the C++ checks (ranges); no model needed
    return params


# The flags under the EngineOptions fields they set, for the engine's error messages.
_FLAGS = {"n_threads": "--threads", "n_ctx": "--ctx-size", "spec": "--spec",
          "draft_max": "--draft-max", "draft_min": "--draft-min"}


def checked_options(options: EngineOptions) -> EngineOptions:
    """options, after the engine's check (EngineOptions.check), its message naming the flag
    ("--threads must be > 0, got 0")."""
    try:
        options.check()
    except ValueError as err:
        message = str(err)
        for name, flag in _FLAGS.items():
            if message.startswith(f"[engine] {name} "):
                raise ValueError(flag + message.removeprefix(f"[engine] {name}")) from None
        raise
    return options


def _generation_flags(
    max_tokens: MaxTokens = None,
    temp: Temp = _D.temperature,
    top_k: TopK = _D.top_k,
    top_p: TopP = _D.top_p,
    min_p: MinP = _D.min_p,
    typical_p: TypicalP = _D.typical_p,
    repeat_penalty: RepeatPenalty = _D.repeat_penalty,
    repeat_last_n: RepeatLastN = _D.repeat_last_n,
    presence_penalty: PresencePenalty = _D.presence_penalty,
    frequency_penalty: FrequencyPenalty = _D.frequency_penalty,
    seed: Seed = None,
    stop: Stop = None,
    threads: Threads = None,
    device: Device = None,
    ctx_size: CtxSize = None,
    spec: Spec = _E.spec,
    draft_model: DraftModel = None,
    draft_max: DraftMax = _E.draft_max,
    draft_min: DraftMin = _E.draft_min,
    mmproj: Mmproj = None,
) -> tuple[SamplingParams, EngineOptions]:
    """The flags `ember run` and `ember chat` share, as the request's SamplingParams and the
    engine's EngineOptions (one request at a time), both checked before the model loads."""
    params = sampling_params(
        temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
        max_tokens=max_tokens, stop=stop)
    if mmproj is not None and not mmproj.is_file():
        raise ValueError(f"--mmproj {mmproj}: no such file")
    options = engine_options(n_threads=threads, device=device, n_ctx=ctx_size, parallel=1,
                             spec=spec, draft_model=draft_model, draft_max=draft_max,
                             draft_min=draft_min, mmproj=str(mmproj) if mmproj else None)
    return params, checked_options(options)


def _parameters(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """function's parameters with their annotations evaluated (as typer reads them)."""
    hints = typing.get_type_hints(function, include_extras=True)
    return [p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(function).parameters.values()]


def with_generation_flags(command: Callable[..., None]) -> Callable[..., None]:
    """`command` takes `params: SamplingParams` and `options: EngineOptions`; its command line
    gets _generation_flags' flags in their place, read into those two."""
    own = _parameters(command)
    at = [p.name for p in own].index("params")
    flags = _parameters(_generation_flags)
    merged = own[:at] + flags + [p for p in own[at:] if p.name not in ("params", "options")]

    @functools.wraps(command)
    def wrapper(**values: Any) -> None:
        params, options = _generation_flags(**{p.name: values.pop(p.name) for p in flags})
        command(**values, params=params, options=options)

    wrapper.__signature__ = inspect.Signature(merged)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in merged}
    return wrapper


def load_llm(model: str | None, options: EngineOptions, chat_template: str | None = None,
             context_overflow: str = "error", lora: Mapping[str, Path] | None = None) -> LLM:
    from ember.hub.models import resolve_model
    from ember.llm import LLM

    if options.draft_model is not None:
        options.draft_model = str(resolve_model(options.draft_model))
    return LLM(model, options=options, chat_template=chat_template,
               context_overflow=context_overflow, lora=lora)


def prediction_text(value: str | None) -> str | None:
    """--prediction: the text itself, or @FILE for a file's contents."""
    if value is None or not value.startswith("@"):
        return value
    from pathlib import Path

    path = Path(value[1:])
    if not path.is_file():
        raise ValueError(f"--prediction {value}: no such file")
    return path.read_text(encoding="utf-8")


def dim(text: str, stream: TextIO = sys.stderr) -> str:
    """`text` dimmed when `stream` is a terminal, plain otherwise."""
    return f"\x1b[2m{text}\x1b[0m" if stream.isatty() else text
