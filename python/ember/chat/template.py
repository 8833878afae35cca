"""Chat templates: turn a list of messages into the prompt text a model was trained on.

A GGUF file carries its model's template in `tokenizer.chat_template` (a Jinja2 template copied
from Hugging Face's tokenizer_config.json). It is rendered the way `transformers` renders it, so
the same messages give the same text in both: a sandboxed, immutable Jinja2 environment with
trim_blocks/lstrip_blocks, the loop-controls extension, `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, and the `{% generation %}` tag. Models without a template
get their architecture's built-in one (ember.chat.builtin: Gemma's turns for gemma*), else
ChatML; `--chat-template NAME|FILE` overrides either.

The template comes from the model file, so it is rendered under limits (ember.chat.limits: 1 s
and 1 M characters by default, tighter where the caller knows the context): `check()` renders
it once on a sample conversation, which is what loading a model does, so a template that loops,
recurses or builds huge strings fails at load, not on the first request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes

from ember.chat import builtin
from ember.chat.limits import (
    BoundedEnvironment,
    RenderLimitError,
    RenderLimits,
    RenderTimeout,
    bounded_render,
)
from ember.images import ImageRef
from ember.media import MEDIA_MARKER

Message = Mapping[str, Any]

CHATML_TEMPLATE = builtin.CHATML


SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a story."},
)


class ChatTemplateError(ValueError):
    """A template failed to compile or render, or refused the messages (raise_exception)."""


class ChatTemplateLimitError(ChatTemplateError):
    """Rendering ran past its time limit (kind "time") or its size limit (kind "size")."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class ChatTemplateRefusal(ChatTemplateError):
    """The template refused the messages itself (raise_exception)."""


class _Refused(jinja2.exceptions.TemplateError):
    pass


def _raise_exception(message: str) -> None:
    raise _Refused(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; for inference it renders its body unchanged."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.bound_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ChatTemplateError(f"chat template: line {err.lineno}: {err.message}") from None


def _plain_content(message: Message) -> dict[str, Any]:
    """A copy of the message whose content is a string when it was a list of parts: text parts
    (OpenAI's [{"type": "text", "text": ...}]) joined with "\n", as llama.cpp joins them, and
    each image (an ember.images.ImageRef) as MEDIA_MARKER, with no "\n" on either side (as
    llama.cpp's media markers); templates expect strings."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        text = ""
        after_image = False
        for part in content:
            if isinstance(part, ImageRef):
                text += MEDIA_MARKER
                after_image = True
                continue
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise ChatTemplateError(f"message content part {part!r} is not supported "
                                        "(only {'type': 'text', 'text': ...} parts and images "
                                        "are)")
            text += ("\n" if text and not after_image else "") + str(part.get("text", ""))
            after_image = False
        out["content"] = text
    return out


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "",
                 default: str = CHATML_TEMPLATE) -> None:
        self.source = source if source else default
        self.is_default = not source  # the model carried none: `default` stands in
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], override: str | None = None) -> ChatTemplate:
        """The template of a GGUF file's metadata (as ember.GGUFFile(path).metadata gives it),
        with bos_token/eos_token looked up in its vocabulary; without one, its architecture's
        built-in. `override` (a source) replaces the file's."""
        tokens = metadata.get("tokenizer.ggml.tokens")

        def token_text(key: str) -> str:
            index = metadata.get(key)
            if isinstance(tokens, list) and isinstance(index, int) and 0 <= index < len(tokens):
                return str(tokens[index])
            return ""

        source = override or metadata.get("tokenizer.chat_template")
        return cls(source if isinstance(source, str) else None,
                   bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"),
                   default=builtin.default_for_arch(metadata.get("general.architecture")))

    @classmethod
    def from_gguf(cls, path: str | Path, override: str | None = None) -> ChatTemplate:
        from ember import _core

        return cls.from_metadata(_core.GGUFFile(str(path)).metadata, override)

    def check(self, limits: RenderLimits | None = None) -> None:
        """Renders the template once on SAMPLE_CONVERSATION under `limits` (default 1 s, 1 M
        characters): ChatTemplateError when it fails, loops, recurses or builds too much. A
        template that refuses the sample itself (raise_exception, e.g. no system role) passes:
        it is well-behaved, just particular."""
        try:
            self.render(SAMPLE_CONVERSATION, limits=limits)
        except ChatTemplateRefusal:
            pass

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               limits: RenderLimits | None = None, **variables: Any) -> str:
        """The prompt text for `messages`, rendered under `limits` (default RenderLimits():
        1 s, 1 M characters). Extra variables (tools, date_string, ...) are passed to the
        template as they are."""
        if not messages:
            raise ChatTemplateError("messages is empty")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise ChatTemplateError(f"messages[{i}] must be a dict with a 'role', got {message!r}")
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **variables,
            "messages": [_plain_content(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        limits = limits or RenderLimits()
        try:
            return bounded_render(lambda: self._template.generate(**context), limits)
        except RenderLimitError as err:
            kind = "time" if isinstance(err, RenderTimeout) else "size"
            raise ChatTemplateLimitError(f"chat template: stopped, {err} (limits: "
                                         f"{limits.describe()})", kind) from None
        except _Refused as err:
            raise ChatTemplateRefusal(f"chat template: {err}") from None
        except jinja2.exceptions.TemplateError as err:
            raise ChatTemplateError(f"chat template: {err}") from None
        except RecursionError:
            raise ChatTemplateError("chat template: it recursed too deeply") from None
        except MemoryError:
            raise ChatTemplateLimitError("chat template: it ran out of memory", "size") from None
        except (TypeError, KeyError, AttributeError, IndexError, ValueError, OverflowError,
                ArithmeticError) as err:
            raise ChatTemplateError(f"chat template failed on these messages: {err}") from None

    def encode(self, tokenizer: Any, messages: Sequence[Message], limits: RenderLimits | None = None,
               **variables: Any) -> list[int]:
        """The prompt tokens for `messages` (the one chat-encode path of ember.LLM, the CLI and
        the server): rendered, then tokenized with control-token texts as those tokens. BOS is
        added as the vocabulary asks, unless the template wrote it itself (Llama 3, Mistral)."""
        text = self.render(messages, add_generation_prompt=True, limits=limits, **variables)
        return self.tokenize(tokenizer, text)

    def tokenize(self, tokenizer: Any, text: str) -> list[int]:
        """The tokens of a rendered prompt (`encode`'s second half)."""
        add_special = not (self.bos_token and text.startswith(self.bos_token))
        return list(tokenizer.encode(text, add_special, True))
