"""ember.LLM: a loaded model with its tokenizer and chat template — generate, stream, chat, and
OpenAI-shaped completions.

    llm = ember.LLM("model.gguf")
    llm.generate("Once upon a time", max_tokens=32, temperature=0).text
    for piece in llm.stream("Once upon a time"): print(piece, end="")
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]

One LLM runs one generation at a time (starting a new one supersedes an unfinished stream).
Consecutive requests whose prompt extends the previous prompt plus its output (chat turns)
only evaluate the new tokens. A KeyboardInterrupt stops a generation and leaves the LLM usable.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Union

from ember import _core
from ember.chat import ChatTemplate, Message
from ember.generate import Delta, GenerationResult, TokenLogprob, generate
from ember.generate import Sequence as KVSequence
from ember.hub import resolve_model
from ember.sampling import SamplingParams

Prompt = Union[str, Sequence[int]]


class LLM:
    def __init__(self, model: str | os.PathLike[str] | None = None, n_threads: int | None = None,
                 n_ctx: int | None = None) -> None:
        """Loads a GGUF model: a path (or a directory holding one .gguf), or None for the
        default demo model. n_threads defaults to the physical cores, n_ctx to the model's
        training context capped at 4096."""
        self.path: Path = resolve_model(model)
        self.model_name = self.path.name
        self._model = _core.Model(str(self.path), n_threads=n_threads, n_ctx=n_ctx)
        self._tokenizer = _core.Tokenizer(str(self.path))
        self._sequence = KVSequence(self._model)
        self._chat_template: ChatTemplate | None = None
        self._n_threads = n_threads
        self._engine: Any = None  # ember.engine.Engine, started by the first generate_batch

    # --- the model ---------------------------------------------------------------------------

    @property
    def model(self) -> _core.Model:
        return self._model

    @property
    def tokenizer(self) -> _core.Tokenizer:
        return self._tokenizer

    @property
    def n_ctx(self) -> int:
        return self._model.n_ctx

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    @property
    def metadata(self) -> dict[str, Any]:
        return self._model.metadata

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's template (ChatML when the GGUF has none), read on first use."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_gguf(self.path)
        return self._chat_template

    # --- text <-> tokens ---------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special adds BOS/EOS as the vocabulary asks, parse_special
        turns control-token texts such as "<|im_start|>" into those tokens."""
        return list(self._tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    def detokenize(self, tokens: Sequence[int], skip_special: bool = True) -> str:
        return self._tokenizer.decode(list(tokens), skip_special=skip_special)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        return self.chat_template.render(messages, add_generation_prompt, **variables)

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            # Like llama.cpp, control tokens spelled out in a raw prompt are those tokens.
            return self.tokenize(prompt, add_special=True, parse_special=True)
        return [int(t) for t in prompt]

    def tokenize_chat(self, messages: Sequence[Message], **variables: Any) -> list[int]:
        """The prompt tokens for `messages` in the model's chat template."""
        text = self.apply_chat_template(messages, **variables)
        bos = self.chat_template.bos_token
        # Templates that write BOS themselves (Llama 3, Mistral) must not get a second one.
        add_special = not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add_special, parse_special=True)

    # --- generation ----------------------------------------------------------------------------

    def stream_deltas(self, prompt: Prompt, params: SamplingParams | None = None,
                      **sampling: Any) -> Iterator[Delta]:
        """The generation as it happens: Delta(text, tokens, logprobs), the last one with
        finish_reason and the full GenerationResult. Sampling keywords are SamplingParams
        fields and override `params`."""
        params = replace(params, **sampling) if params else SamplingParams(**sampling)
        return generate(self._sequence, self._tokenizer, self._prompt_tokens(prompt), params)

    def generate(self, prompt: Prompt, params: SamplingParams | None = None,
                 **sampling: Any) -> GenerationResult:
        """Generates a completion of `prompt` (text, or token ids used as they are)."""
        return _last(self.stream_deltas(prompt, params, **sampling))

    def generate_batch(self, prompts: Sequence[Prompt], params: SamplingParams | None = None,
                       **sampling: Any) -> list[GenerationResult]:
        """Generates completions of many prompts at once on the continuous-batching engine
        (started on first use over the same file mapping; up to 16 sequences per step, prefix
        caching across calls). Results come back in the order of `prompts`."""
        from ember.engine import Engine, generate_batch

        params = replace(params, **sampling) if params else SamplingParams(**sampling)
        if self._engine is None:
            self._engine = Engine(str(self.path), n_threads=self._n_threads, n_ctx=self.n_ctx)
        return generate_batch(self._engine, prompts, params)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               **sampling: Any) -> Iterator[str]:
        """Yields the completion's text as it is generated."""
        return _texts(self.stream_deltas(prompt, params, **sampling))

    def chat_deltas(self, messages: Sequence[Message], params: SamplingParams | None = None,
                    **sampling: Any) -> Iterator[Delta]:
        """Like stream_deltas, for the model's answer to `messages` in its chat template."""
        return self.stream_deltas(self.tokenize_chat(messages), params, **sampling)

    def chat(self, messages: Sequence[Message], params: SamplingParams | None = None,
             **sampling: Any) -> GenerationResult:
        """The assistant's answer to `messages` ([{"role": ..., "content": ...}, ...])."""
        return _last(self.chat_deltas(messages, params, **sampling))

    def stream_chat(self, messages: Sequence[Message], params: SamplingParams | None = None,
                    **sampling: Any) -> Iterator[str]:
        return _texts(self.chat_deltas(messages, params, **sampling))

    def reset(self) -> None:
        """Empties the KV cache (the next prompt is evaluated from scratch)."""
        self._sequence.reset()

    # --- OpenAI-shaped results -----------------------------------------------------------------

    def create_completion(self, prompt: Prompt, *, max_tokens: int | None = 16,
                          stream: bool = False, logprobs: int | None = None,
                          **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's /v1/completions: a "text_completion" dict, or its chunks when stream=True.
        logprobs=N reports the N most likely alternatives of each token. As OpenAI's,
        max_tokens defaults to 16."""
        params = _openai_params(sampling, max_tokens=max_tokens,
                                logprobs=logprobs is not None, top_logprobs=logprobs or 0)
        deltas = self.stream_deltas(prompt, params)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if stream:
            return self._completion_chunks(deltas, head)
        result = _last(deltas)
        return {**head, "choices": [{
            "text": result.text, "index": 0,
            "logprobs": _completion_logprobs(result.logprobs or []) if params.logprobs else None,
            "finish_reason": result.finish_reason,
        }], "usage": result.usage.to_dict()}

    def _completion_chunks(self, deltas: Iterator[Delta], head: dict[str, Any],
                           ) -> Iterator[dict[str, Any]]:
        offset = 0
        for delta in deltas:
            if delta.text or delta.finish_reason:
                logprobs = _completion_logprobs(delta.logprobs, offset) if delta.logprobs else None
                offset += len(delta.text)
                yield {**head, "choices": [{"text": delta.text, "index": 0, "logprobs": logprobs,
                                            "finish_reason": delta.finish_reason}]}

    def create_chat_completion(self, messages: Sequence[Message], *, stream: bool = False,
                               logprobs: bool = False, top_logprobs: int | None = None,
                               max_tokens: int | None = None,
                               max_completion_tokens: int | None = None,
                               stream_options: Mapping[str, Any] | None = None,
                               **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's /v1/chat/completions: a "chat.completion" dict, or its chunks when
        stream=True (first a role delta, then content deltas, then one with finish_reason;
        with stream_options={"include_usage": True}, one more with the usage)."""
        params = _openai_params(sampling, max_tokens=max_completion_tokens or max_tokens,
                                logprobs=logprobs, top_logprobs=top_logprobs or 0)
        deltas = self.chat_deltas(messages, params)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model_name}
        if stream:
            include_usage = bool(stream_options and stream_options.get("include_usage"))
            return self._chat_chunks(deltas, {**head, "object": "chat.completion.chunk"},
                                     include_usage)
        result = _last(deltas)
        return {**head, "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": {"content": _chat_logprobs(result.logprobs or [])} if logprobs else None,
            "finish_reason": result.finish_reason,
        }], "usage": result.usage.to_dict()}

    def _chat_chunks(self, deltas: Iterator[Delta], head: dict[str, Any],
                     include_usage: bool) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
            return {**head, "choices": [{
                "index": 0, "delta": delta,
                "logprobs": {"content": _chat_logprobs(logprobs)} if logprobs else None,
                "finish_reason": finish_reason,
            }]}

        yield chunk({"role": "assistant", "content": ""})
        for delta in deltas:
            if delta.text:
                yield chunk({"content": delta.text}, logprobs=delta.logprobs)
            if delta.finish_reason:
                yield chunk({}, delta.finish_reason)
                if include_usage and delta.result:
                    yield {**head, "choices": [], "usage": delta.result.usage.to_dict()}


def _texts(deltas: Iterator[Delta]) -> Iterator[str]:
    return (delta.text for delta in deltas if delta.text)


def _last(deltas: Iterator[Delta]) -> GenerationResult:
    for delta in deltas:
        if delta.result is not None:
            return delta.result
    raise RuntimeError("generation ended without a result")  # generate() always ends with one


# OpenAI's names for fields that SamplingParams calls differently.
_OPENAI_ALIASES = {"repetition_penalty": "repeat_penalty"}


def _openai_params(sampling: Mapping[str, Any], **fixed: Any) -> SamplingParams:
    fields = SamplingParams.field_names()
    values: dict[str, Any] = {}
    for key, value in sampling.items():
        name = _OPENAI_ALIASES.get(key, key)
        if name not in fields:
            raise TypeError(f"unknown sampling parameter '{key}'")
        if value is not None:  # OpenAI clients send null for "default"
            values[name] = value
    return SamplingParams(**values, **fixed)


def _chat_logprobs(entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    return [{
        "token": e.text, "logprob": e.logprob, "bytes": list(e.bytes),
        "top_logprobs": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.bytes)}
                         for t in e.top],
    } for e in entries]


def _completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {
        "tokens": [e.text for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t.text: t.logprob for t in e.top} for e in entries],
        "text_offset": offsets,
    }
