"""Chat templates: turn a list of messages into the prompt text a model was trained on.

A GGUF file carries its model's template in `tokenizer.chat_template` (a Jinja2 template copied
from Hugging Face's tokenizer_config.json). It is rendered the way `transformers` renders it, so
the same messages give the same text in both: a sandboxed, immutable Jinja2 environment with
trim_blocks/lstrip_blocks, the loop-controls extension, `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, and the `{% generation %}` tag. Models without a template
get ChatML.
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
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """A template failed to compile or render, or refused the messages (raise_exception)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


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
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ChatTemplateError(f"chat template: line {err.lineno}: {err.message}") from None


def _plain_content(message: Message) -> dict[str, Any]:
    """A copy of the message whose content is a string when it was a list of text parts
    (OpenAI's [{"type": "text", "text": ...}]); templates expect strings."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise ChatTemplateError(f"message content part {part!r} is not supported "
                                        "(only {'type': 'text', 'text': ...} parts are)")
            texts.append(str(part.get("text", "")))
        out["content"] = "".join(texts)
    return out


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source if source else CHATML_TEMPLATE
        self.is_default = not source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> ChatTemplate:
        """The template of a GGUF file's metadata (as ember.GGUFFile(path).metadata gives it),
        with bos_token/eos_token looked up in its vocabulary."""
        tokens = metadata.get("tokenizer.ggml.tokens")

        def token_text(key: str) -> str:
            index = metadata.get(key)
            if isinstance(tokens, list) and isinstance(index, int) and 0 <= index < len(tokens):
                return str(tokens[index])
            return ""

        source = metadata.get("tokenizer.chat_template")
        return cls(source if isinstance(source, str) else None,
                   bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"))

    @classmethod
    def from_gguf(cls, path: str | Path) -> ChatTemplate:
        from ember import _core

        return cls.from_metadata(_core.GGUFFile(str(path)).metadata)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt text for `messages`. Extra variables (tools, date_string, ...) are passed
        to the template as they are."""
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
        try:
            return self._template.render(**context)
        except jinja2.exceptions.TemplateError as err:
            raise ChatTemplateError(f"chat template: {err}") from None
        except (TypeError, KeyError, AttributeError, IndexError) as err:
            raise ChatTemplateError(f"chat template failed on these messages: {err}") from None

    def encode(self, tokenizer: Any, messages: Sequence[Message], **variables: Any) -> list[int]:
        """The prompt tokens for `messages` (the one chat-encode path of ember.LLM, the CLI and
        the server): rendered, then tokenized with control-token texts as those tokens. BOS is
        added as the vocabulary asks, unless the template wrote it itself (Llama 3, Mistral)."""
        text = self.render(messages, add_generation_prompt=True, **variables)
        add_special = not (self.bos_token and text.startswith(self.bos_token))
        return list(tokenizer.encode(text, add_special, True))
