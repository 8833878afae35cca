"""ember.LLM: a model on the continuous-batching engine, with its tokenizer and chat template —
generate, stream, chat, batches, and OpenAI-shaped completions.

    llm = ember.LLM("model.gguf")
    llm.generate("Once upon a time", max_tokens=32, temperature=0).text
    for piece in llm.stream("Once upon a time"): print(piece, end="")
    llm.create_chat_completion([{"role": "user", "content": "Hi!"}])["choices"][0]["message"]
    llm.create_chat_completion(messages, tools=[{"type": "function", "function": {...}}])

A thin layer over ember.engine.Engine, the same path the CLI and the server run: requests from
any number of threads are batched together, and the prefix cache serves every request, so a
second prompt sharing a long system prompt, or the next turn of a chat, only evaluates what is
new. A KeyboardInterrupt stops a generation (its request is cancelled) and leaves the LLM usable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Union

import numpy as np

from ember import _core
from ember.chat.template import ChatTemplate, Message
from ember.context_fit import Dropped, check_policy, fit_chat, fit_tokens
from ember.embeddings import Embedder, EmbeddingInput, is_embedding_model
from ember.engine import Engine
from ember.grammar import Constraint
from ember.hub.models import resolve_model
from ember.images import LOCAL, ImageError, ImageRef, ImageSource, refs_in, with_images
from ember.images import load as load_image
from ember.openai_format import Formatter
from ember.options import EngineOptions, engine_options
from ember.results import Delta, GenerationResult
from ember.sampling import SamplingParams
from ember.tools.prompt import PreparedChat, prepare_chat
from ember.tools.request import parse_tools

Prompt = Union[str, Sequence[int]]


@dataclass
class ChatPrompt:
    """A chat's prompt, fitted into the context: its tokens, how to read the answer, what
    fitting left out, and the RGB pixels of its image markers, in order."""

    tokens: list[int]
    chat: PreparedChat
    dropped: Dropped
    images: list[np.ndarray]


class LLM:
    def __init__(self, model: str | os.PathLike[str] | None = None, n_threads: int | None = None,
                 n_ctx: int | None = None, *, options: EngineOptions | None = None,
                 chat_template: str | None = None, pooling: str | None = None,
                 context_overflow: str = "error",
                 lora: Mapping[str, str | os.PathLike[str]] | None = None,
                 **engine_fields: Any) -> None:
        """Loads a GGUF model: a path (or a directory holding one .gguf), a Hugging Face Hub
        reference hf://USER/REPO[:QUANT] (see ember.hub.hf), or None for the default demo
        model, on the engine with `options` (an ember.EngineOptions, else the defaults) and
        any of its fields as keywords on top (see ember.engine.Engine): n_threads defaults to
        the physical cores, n_ctx (tokens one request may reach) to the model's training
        context capped at EngineOptions.default_max_ctx; `parallel` requests run at once over a
        KV cache of kv_size tokens. Speculative decoding (same output, sooner): spec="ngram"
        (prompt lookup) or draft_model=PATH (a small model with the same vocabulary), at most
        draft_max drafts per step; a request's prediction= (text the output is expected to be)
        drafts from that text. mmproj=PATH: the model's vision projector (llama.cpp's clip
        layout, `ember convert` writes it beside a vision model), so prompts may hold images.
        device "cpu", "cuda[:N]", "vulkan[:N]" or "auto" (default: $EMBER_DEVICE,
        else "auto": the first GPU, else the CPU; an embedding model runs on the CPU, see
        ember.embeddings.Embedder). chat_template: a built-in template's name (gemma, chatml,
        llama3) or a Jinja file, instead of the model's (see ember.chat.builtin). pooling: how
        embed() pools token states (none, mean, cls, last, rank), instead of the file's
        pooling_type; a generation model embeds too, with an Embedder of the same file
        loaded on the first embed (a second copy of the weights the CPU backend repacks).
        context_overflow: what a prompt longer than the context (with the room kept for its
        answer) becomes (ember.context_fit): "error" (PromptTooLong), "shift" (a chat's oldest
        whole turns dropped) or "truncate-middle" (its first and last tokens kept); the
        result's usage.dropped_tokens and dropped_messages say what went. lora: LoRA adapters
        by name, {"french": "french.gguf"} (`ember convert --lora` makes them); a call picks
        one with lora="french" (and lora_scale=0.5, default 1), e.g. llm.generate(prompt,
        lora="french"); without it the plain model answers. mmproj: a vision model's projector
        (an mmproj .gguf): chat() then takes images (see chat_deltas)."""
        self.context_overflow = check_policy(context_overflow)
        self.path: Path = resolve_model(model)
        self.model_name = self.path.name
        options = engine_options(options, n_threads=n_threads, n_ctx=n_ctx, **engine_fields)
        # An embedding model (bert) gets an Embedder instead of the generation engine; a
        # generation model gets one on its first embed().
        self.embedder: Embedder | None = None
        self._engine: Engine | None = None
        self._embedder_args = {"n_threads": options.n_threads, "device": options.device,
                               "pooling": pooling}
        if is_embedding_model(self.path):
            if lora:
                raise ValueError(f"{self.path.name} is an embedding model; LoRA adapters apply "
                                 "to generation models only")
            self.embedder = Embedder(self.path, **self._embedder_args)
        else:
            self._engine = Engine(self.path, options, chat_template=chat_template, lora=lora)
        self._metadata: dict[str, Any] | None = None

    @property
    def engine(self) -> Engine:
        """The generation engine; ValueError for an embedding model, which does not generate."""
        if self._engine is None:
            raise ValueError(f"{self.model_name} is an embedding model: it does not generate "
                             "(use LLM.embed)")
        return self._engine

    # --- the model ---------------------------------------------------------------------------

    @property
    def tokenizer(self) -> _core.Tokenizer:
        return self.engine.tokenizer if self._engine else self.embedder.tokenizer  # type: ignore[union-attr]

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx if self._engine else self.embedder.max_tokens  # type: ignore[union-attr]

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    @property
    def metadata(self) -> dict[str, Any]:
        """GGUF metadata: scalars and strings (arrays such as the vocabulary left out)."""
        if self._metadata is None:
            md = _core.GGUFFile(str(self.path)).metadata
            self._metadata = {k: v for k, v in md.items() if not isinstance(v, list)}
        return self._metadata

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's template (ChatML when the GGUF has none), read on first use."""
        return self.engine.chat_template

    # --- text <-> tokens ---------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special adds BOS/EOS as the vocabulary asks, parse_special
        turns control-token texts such as "<|im_start|>" into those tokens."""
        return list(self.tokenizer.encode(text, add_special, parse_special))

    def detokenize(self, tokens: Sequence[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special=skip_special)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        return self.chat_template.render(messages, add_generation_prompt, **variables)

    def tokenize_chat(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]
                      | None = None, **variables: Any) -> list[int]:
        """The prompt tokens for `messages` (and OpenAI-shaped `tools`) in the model's chat
        template; other variables go to the template as they are."""
        return self._chat_prompt(messages, tools, None, None, variables, fit=False).tokens

    def _chat_prompt(self, messages: Sequence[Message], tools: Any, tool_choice: Any,
                     parallel_tool_calls: Any, variables: Mapping[str, Any] | None = None, *,
                     max_tokens: int | None = None, fit: bool = True,
                     images: Sequence[ImageSource] = ()) -> ChatPrompt:
        """The prompt tokens, how to read tool calls in the answer (ember.tools.prompt), what
        fitting them into the context (`fit`, with max_tokens' room for the answer) left out,
        and the pixels of its images (the messages' image_url parts and `images`, see
        ember.images.with_images; ImageError for a bad one, ValueError for a model without
        vision)."""
        request = parse_tools(tools, tool_choice, parallel_tool_calls)
        messages = with_images(messages, images)
        refs = refs_in(messages)
        pixels = {id(ref): _load(ref) for ref in refs}
        if refs and not self.engine.vision:
            raise ValueError(f"'{refs[0].param}': this model takes no images; load it with "
                             "mmproj=FILE (its vision projector; ember run/chat --mmproj)")
        prepared: dict[int, PreparedChat] = {}

        def tokens_of(kept: list[Message]) -> list[int]:
            chat = prepared[len(kept)] = prepare_chat(self.chat_template, self.tokenizer, kept,
                                                      request)
            text = self.chat_template.render(chat.messages, add_generation_prompt=True,
                                             **{**(variables or {}), **chat.variables})
            if pixels:
                return self.engine.tokenize_images(text + chat.answer_prefix,
                                                   [pixels[id(r)] for r in refs_in(kept)])
            return self.chat_template.tokenize(self.tokenizer, text + chat.answer_prefix)

        policy = self.context_overflow if fit else "error"
        kept, tokens, dropped = fit_chat(messages, tokens_of, policy, self.n_ctx, max_tokens,
                                         bos=self._bos())
        return ChatPrompt(tokens, prepared[len(kept)], dropped,
                          [pixels[id(r)] for r in refs_in(kept)])

    def _bos(self) -> int | None:
        bos = self.engine.tokenize("", add_special=True)
        return bos[0] if bos else None

    def _prompt_tokens(self, prompt: Prompt, max_tokens: int | None) -> tuple[list[int], Dropped]:
        # Like llama.cpp, control tokens spelled out in a raw prompt are those tokens.
        tokens = self.engine.tokenize(prompt, add_special=True, parse_special=True)
        return fit_tokens(tokens, self.context_overflow, self.n_ctx, max_tokens, bos=self._bos())

    # --- generation ----------------------------------------------------------------------------

    def stream_deltas(self, prompt: Prompt, params: SamplingParams | None = None, *,
                      keep_tokens: Sequence[int] = (), **sampling: Any) -> Iterator[Delta]:
        """The generation as it happens: Delta(text, tokens, logprobs), the last one with
        finish_reason and the full GenerationResult. Sampling keywords are SamplingParams
        fields and override `params`. A bad prompt or parameter raises ValueError here.
        keep_tokens: control tokens whose text stays in the output."""
        params = _params(params, sampling)
        tokens, dropped = self._prompt_tokens(prompt, params.max_tokens)
        return iter(self.engine.submit(tokens, params, keep_tokens=keep_tokens,
                                       dropped=dropped))

    def _chat_deltas(self, prompt: ChatPrompt, params: SamplingParams) -> Iterator[Delta]:
        """A fitted chat prompt's generation (ember.context_fit)."""
        return iter(self.engine.submit(prompt.tokens, params, keep_tokens=prompt.chat.keep_tokens,
                                       dropped=prompt.dropped, images=prompt.images))

    def generate(self, prompt: Prompt, params: SamplingParams | None = None,
                 **sampling: Any) -> GenerationResult:
        """Generates a completion of `prompt` (text, or token ids used as they are)."""
        params = _params(params, sampling)
        tokens, dropped = self._prompt_tokens(prompt, params.max_tokens)
        return self.engine.submit(tokens, params, dropped=dropped).result()

    def generate_batch(self, prompts: Sequence[Prompt], params: SamplingParams | None = None,
                       **sampling: Any) -> list[GenerationResult]:
        """Generates completions of many prompts at once (batched in the engine's steps).
        Results come back in the order of `prompts`."""
        params = _params(params, sampling)
        fitted = [self._prompt_tokens(p, params.max_tokens) for p in prompts]
        return self.engine.generate_batch([tokens for tokens, _ in fitted], params,
                                          dropped=[dropped for _, dropped in fitted])

    def stream(self, prompt: Prompt, params: SamplingParams | None = None,
               **sampling: Any) -> Iterator[str]:
        """Yields the completion's text as it is generated."""
        return _texts(self.stream_deltas(prompt, params, **sampling))

    def chat_deltas(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    images: Sequence[ImageSource] = (), **sampling: Any) -> Iterator[Delta]:
        """Like stream_deltas, for the model's answer to `messages` (and `tools`, OpenAI's
        [{"type": "function", "function": {...}}]) in its chat template. The text is the
        model's own, tool-call markup included (create_chat_completion parses it). images:
        pictures for the last user message (paths, image file bytes, data URLs or RGB uint8
        arrays [height, width, 3]), placed before its text; messages may also hold OpenAI's
        image_url parts (a data URL, file:// URL or path). A vision model needs its projector:
        LLM(model, mmproj=FILE)."""
        params = _params(params, sampling)
        prompt = self._chat_prompt(messages, tools, None, None, max_tokens=params.max_tokens,
                                   images=images)
        return self._chat_deltas(prompt, params)

    def chat(self, messages: Sequence[Message], params: SamplingParams | None = None, *,
             tools: Sequence[Mapping[str, Any]] | None = None, images: Sequence[ImageSource] = (),
             **sampling: Any) -> GenerationResult:
        """The assistant's answer to `messages` ([{"role": ..., "content": ...}, ...]), with
        `images` for the last user message (see chat_deltas)."""
        return _last(self.chat_deltas(messages, params, tools=tools, images=images, **sampling))

    def stream_chat(self, messages: Sequence[Message], params: SamplingParams | None = None,
                    **sampling: Any) -> Iterator[str]:
        return _texts(self.chat_deltas(messages, params, **sampling))

    # --- embeddings ----------------------------------------------------------------------------

    def embed(self, inputs: EmbeddingInput | Sequence[EmbeddingInput], normalize: bool = True
              ) -> np.ndarray:
        """Embeddings of texts (or token-id lists): float32 [len(inputs), n_embd], pooled as
        the model's file (or LLM's pooling) says and of unit length unless normalize=False; a
        single text (or one list of token ids) gives one row. ValueError with pooling none
        (a chat model's file says nothing: LLM(..., pooling="last"), "mean", ...)."""
        if self.embedder is None:
            self.embedder = Embedder(self.path, **self._embedder_args)
        single = isinstance(inputs, str) or (bool(inputs) and isinstance(inputs[0], int))
        batch = [inputs] if single else list(inputs)
        return self.embedder.embed(batch, normalize)

    # --- prompt state ------------------------------------------------------------------------

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int] | None = None) -> int:
        """Saves the prompt state of the last generation (its prompt and output tokens and
        their K/V, whole KV blocks) to a file; `tokens` instead names another sequence whose
        blocks are still cached. Returns the tokens whose K/V the file holds."""
        return self.engine.save_state(path, self.engine.last_sequence if tokens is None else tokens)[0]

    def load_state(self, path: str | os.PathLike[str]) -> list[int]:
        """Loads a saved state into the prefix cache: a prompt that starts with its tokens (the
        same prompt, or the conversation's next turn) reuses their K/V instead of recomputing
        them, in this or a later process with the same model and kv_type. Returns the state's
        tokens. ValueError for a file of another model or KV type, or a corrupt one."""
        return self.engine.load_state(path)[0]

    def close(self) -> None:
        """Stops the engine thread (also done when the LLM is garbage-collected)."""
        if self._engine is not None:
            self._engine.close()

    # --- OpenAI-shaped results -----------------------------------------------------------------

    def create_completion(self, prompt: Prompt, *, max_tokens: int | None = 16,
                          stream: bool = False, logprobs: int | None = None,
                          **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's /v1/completions: a "text_completion" dict, or its chunks when stream=True.
        logprobs=N reports the N most likely alternatives of each token. As OpenAI's,
        max_tokens defaults to 16."""
        params = _openai_params(sampling, max_tokens=max_tokens,
                                logprobs=logprobs is not None, top_logprobs=logprobs or 0)
        fmt = Formatter(chat=False, model=self.model_name, n_choices=1,
                        logprobs=params.logprobs)
        return _shaped(fmt, self.stream_deltas(prompt, params), stream, include_usage=False)

    def create_chat_completion(self, messages: Sequence[Message], *, stream: bool = False,
                               logprobs: bool = False, top_logprobs: int | None = None,
                               max_tokens: int | None = None,
                               max_completion_tokens: int | None = None,
                               stream_options: Mapping[str, Any] | None = None,
                               tools: Sequence[Mapping[str, Any]] | None = None,
                               tool_choice: str | Mapping[str, Any] | None = None,
                               parallel_tool_calls: bool | None = None,
                               prediction: Mapping[str, Any] | str | None = None,
                               **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI's /v1/chat/completions: a "chat.completion" dict, or its chunks when
        stream=True (first a role delta, then content deltas, then one with finish_reason;
        with stream_options={"include_usage": True}, one more with the usage). With `tools`
        the answer's tool calls come as message.tool_calls (finish_reason "tool_calls") or
        tool_calls deltas; tool_choice "required" or a named function constrain the answer to
        a valid call of the allowed functions. prediction: Predicted Outputs, {"type":
        "content", "content": "..."} (or the text itself); the usage then has
        completion_tokens_details.accepted/rejected_prediction_tokens. User messages may hold
        image_url parts, as the server takes them (see chat_deltas)."""
        if isinstance(prediction, Mapping):
            if prediction.get("type") != "content" or not isinstance(prediction.get("content"), str):
                raise ValueError('prediction must be {"type": "content", "content": "..."}, got '
                                 f"{prediction!r}"[:200])
            prediction = prediction["content"]
        params = _openai_params(sampling, max_tokens=max_completion_tokens or max_tokens,
                                logprobs=logprobs, top_logprobs=top_logprobs or 0,
                                prediction=prediction)
        prompt = self._chat_prompt(messages, tools, tool_choice, parallel_tool_calls,
                                   max_tokens=params.max_tokens)
        chat = prompt.chat
        if chat.constraint is not None:  # a forced call (tool_choice required / named)
            if params.constraint is not None:
                raise ValueError("tool_choice forces a tool call, which constrains the whole "
                                 "output, as json_schema/grammar does too; give one of them")
            params = replace(params, constraint=chat.constraint.grammar())
        fmt = Formatter(chat=True, model=self.model_name, n_choices=1, logprobs=logprobs,
                        tool_format=chat.format, answer_prefix=chat.answer_prefix)
        include_usage = bool(stream_options and stream_options.get("include_usage"))
        return _shaped(fmt, self._chat_deltas(prompt, params), stream, include_usage)


def _load(ref: ImageRef) -> np.ndarray:
    """An image's pixels; ImageError naming it (its path, else where it was given)."""
    try:
        return load_image(ref.source, LOCAL)
    except ImageError as err:
        source = os.fspath(ref.source) if isinstance(ref.source, (str, os.PathLike)) else ""
        shown = source if source and not source.startswith("data:") and len(source) <= 200 \
            else ref.param
        message = str(err) if str(err).startswith(shown) else f"{shown}: {err}"
        raise ImageError(message, err.code, err.status) from None


def _shaped(fmt: Formatter, deltas: Iterator[Delta], stream: bool,
            include_usage: bool) -> dict[str, Any] | Iterator[dict[str, Any]]:
    if stream:
        return _chunks(fmt, deltas, include_usage)
    for delta in deltas:
        fmt.add(0, delta)
    return fmt.response()


def _chunks(fmt: Formatter, deltas: Iterator[Delta], include_usage: bool
            ) -> Iterator[dict[str, Any]]:
    yield from fmt.first_chunks()
    for delta in deltas:
        yield from fmt.chunks(0, delta)
    if include_usage:
        yield fmt.usage_chunk()


def _params(params: SamplingParams | None, sampling: Mapping[str, Any]) -> SamplingParams:
    sampling = _constraint_keywords(sampling)
    return replace(params, **sampling) if params else SamplingParams(**sampling)


def _constraint_keywords(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """json_schema=SCHEMA (a dict, True or JSON text) and grammar=GBNF as a Constraint."""
    values = dict(sampling)
    schema, grammar = values.pop("json_schema", None), values.pop("grammar", None)
    if schema is not None and grammar is not None:
        raise ValueError("give json_schema or grammar, not both")
    if schema is not None:
        values["constraint"] = Constraint.json_schema(schema)
    elif grammar is not None:
        values["constraint"] = Constraint.gbnf(grammar)
    return values


def _texts(deltas: Iterator[Delta]) -> Iterator[str]:
    return (delta.text for delta in deltas if delta.text)


def _last(deltas: Iterator[Delta]) -> GenerationResult:
    for delta in deltas:
        if delta.result is not None:
            return delta.result
    raise RuntimeError("generation ended without a result")  # a request always ends with one


# OpenAI's names for fields that SamplingParams calls differently.
_OPENAI_ALIASES = {"repetition_penalty": "repeat_penalty"}


def _openai_params(sampling: Mapping[str, Any], **fixed: Any) -> SamplingParams:
    fields = SamplingParams.field_names()
    values: dict[str, Any] = {}
    for key, value in _constraint_keywords(sampling).items():
        name = _OPENAI_ALIASES.get(key, key)
        if name not in fields:
            raise TypeError(f"unknown sampling parameter '{key}'")
        if value is not None:  # OpenAI clients send null for "default"
            values[name] = value
    return SamplingParams(**values, **fixed)
