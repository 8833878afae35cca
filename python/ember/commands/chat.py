"""`ember chat [MODEL]`: an interactive chat in the terminal.

Each line is a user message; the answer streams to stdout, then its speed goes to stderr
(dimmed on a terminal). /image FILE attaches a picture to the next message (a vision model:
--mmproj), /clear starts a new conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer.
With stdin from a pipe there is no prompt and no terminal styling, so
`printf 'Hi!\\n' | ember chat` prints just the answers.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import typer

from ember.commands import generation_options as opt
from ember.context_fit import check_policy
from ember.images import ImageRef
from ember.images import load as load_image
from ember.options import EngineOptions
from ember.results import Usage
from ember.sampling import SamplingParams

if TYPE_CHECKING:
    from ember.llm import LLM

HELP = ("/image FILE: a picture for the next message   /clear: start over   /exit: quit   "
        "Ctrl-C: stop an answer   Ctrl-D: quit")


@opt.with_generation_flags
def chat(
    model: opt.ModelArg = None,
    system: opt.System = None,
    *,
    params: SamplingParams,
    options: EngineOptions,
    chat_template: opt.ChatTemplateOpt = None,
    context_overflow: opt.ContextOverflow = "shift",
) -> None:
    """Chat with a model in the terminal (reads messages from stdin when it is a pipe). A
    conversation longer than the context keeps going: by default its oldest turns are left out
    of the prompt (--context-overflow shift), and a note on stderr says so."""
    llm = opt.load_llm(model, options, chat_template, check_policy(context_overflow, "--context-overflow"))
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())

        print(opt.dim(f"ember chat: {llm.model_name}. {HELP}"), file=sys.stderr)

    start: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    history = list(start)
    pending: list[ImageRef] = []  # /image pictures for the next message
    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            if interactive:
                print(file=sys.stderr)
            break
        except KeyboardInterrupt:
            print("\n" + opt.dim("(/exit or Ctrl-D quits)"), file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            break
        if text == "/image" or text.startswith("/image "):
            note = _attach(llm, text.removeprefix("/image").strip(), pending)
            print(opt.dim(note), file=sys.stderr)
            continue
        if text == "/clear":
            history = list(start)
            pending.clear()
            print(opt.dim("(new conversation)"), file=sys.stderr)
            continue
        if text in ("/help", "/?"):
            print(opt.dim(HELP), file=sys.stderr)
            continue

        history.append({"role": "user", "content": [*pending, {"type": "text", "text": text}]}
                       if pending else {"role": "user", "content": text})
        pending.clear()
        answer: list[str] = []
        stats = ""
        try:
            for delta in llm.chat_deltas(history, params):
                if delta.text:
                    answer.append(delta.text)
                    sys.stdout.write(delta.text)
                    sys.stdout.flush()
                if delta.result is not None:
                    r = delta.result
                    stats = (f"[{r.usage.completion_tokens} tokens, {r.timings.tokens_per_s:.1f} "
                             f"tokens/s, prompt {r.timings.prompt_ms:.0f} ms]")
                    stats = _dropped_note(r.usage) + stats
        except KeyboardInterrupt:
            stats = "[interrupted]"
        # The conversation keeps what was shown, even of an interrupted answer.
        history.append({"role": "assistant", "content": "".join(answer)})
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(opt.dim(stats), file=sys.stderr)


def _attach(llm: LLM, path: str, pending: list[ImageRef]) -> str:
    """/image PATH: the picture decoded now (a bad file is said at once) and kept for the next
    message; what to tell the user."""
    if not path:
        return "(/image FILE attaches a picture to the next message)"
    if not llm.engine.vision:
        return "(this model takes no images; start ember chat with --mmproj FILE, its vision " \
               "projector)"
    try:
        pixels = load_image(os.path.expanduser(path))
    except ValueError as err:
        return f"({err})"
    pending.append(ImageRef(pixels, f"/image {path}"))
    return f"(image {path}: {pixels.shape[1]}x{pixels.shape[0]}, goes with the next message)"


def _dropped_note(usage: Usage) -> str:
    """What fitting the conversation into the context left out of this answer's prompt."""
    if not (usage.dropped_messages or usage.dropped_tokens):
        return ""
    what = f"the {usage.dropped_messages} oldest messages" if usage.dropped_messages else ""
    if usage.dropped_tokens and usage.dropped_messages:
        what += f" ({usage.dropped_tokens} tokens)"
    elif usage.dropped_tokens:
        what = f"{usage.dropped_tokens} tokens from the middle"
    return f"[context full: {what} left out] "


def register(app: typer.Typer) -> None:
    app.command(cls=opt.OneLineErrors)(chat)
