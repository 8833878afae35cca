"""The one execution path: requests on the continuous-batching engine (ember._core.Engine).

The C++ engine thread runs every submitted request in shared batched steps over a paged KV
cache with prefix caching (a prompt that shares a prefix with an earlier one skips its
prefill, every shared token but a repeated prompt's last). This module adds the text side:
tokenizing prompts, detokenizing output, dropping end-of-generation tokens, stop strings (a
matched stop string cancels the request, which frees its KV blocks) and results. ember.LLM,
the CLI and the server all generate through it.

    engine = Engine("model.gguf", parallel=4)   # or Engine(path, EngineOptions(parallel=4))
    request = engine.submit(engine.tokenize("Once upon a time"), SamplingParams(max_tokens=32))
    for delta in request:                  # blocking, GIL released while waiting
        print(delta.text, end="")
    async for delta in engine.submit(tokens, params):   # on an asyncio loop: never blocks it
        ...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any, Optional, Union

from ember import _core
from ember.chat import builtin
from ember.chat.template import ChatTemplate
from ember.context_fit import Dropped
from ember.core_attribute import CoreAttribute
from ember.grammar import GrammarCompiler
from ember.media import MEDIA_MARKER
from ember.options import EngineOptions, engine_options, resolve_device  # noqa: F401 (re-exported)
from ember.results import Delta, GenerationResult, Timings, TokenLogprob, Usage
from ember.sampling import SamplingParams
from ember.vision import ImagePrompts

Prompt = Union[str, Sequence[int]]  # text (tokenized with the model's vocabulary) or token ids

EngineBusy = _core.EngineBusy  # submit() past the engine's max_queue, or after close()
# A request that can never run (ValueError subclasses): an empty prompt, a bad token id or
# max_tokens; PromptTooLong (n_prompt_tokens, n_ctx) for a prompt over the context.
InvalidRequest = _core.InvalidRequest
PromptTooLong = _core.PromptTooLong


class EngineError(RuntimeError):
    """The engine failed a request (its model step raised); the message says why."""


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_usage: float               # fraction of KV blocks some request references
    prefix_query_tokens: int      # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int        # of those, served by it (ember_prefix_cache_hits_total)
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions: int
    steps: int
    # Speculative decoding, per draft source ("ngram", "prediction", "draft_model"): drafts
    # verified and, of them, accepted.
    drafted_tokens: dict[str, int] = field(default_factory=dict)
    accepted_tokens: dict[str, int] = field(default_factory=dict)
    step_fixed_s: float = 0.0     # the engine's fitted step cost: fixed + per_row * rows seconds
    step_per_row_s: float = 0.0
    draft_fixed_s: float = 0.0    # likewise for one pass of the draft model (0 without one)
    draft_per_row_s: float = 0.0
    disk_hit_tokens: int = 0      # of prefix_hit_tokens, read from the disk cache (cache_dir)
    # The disk cache's files: files, bytes, written, read, rejected (bad files ignored), dropped
    # (writes a full queue refused), evicted (for cache_disk_bytes); all 0 without cache_dir.
    disk_cache: dict[str, int] = field(default_factory=dict)
    images_encoded: int = 0       # images run through the vision encoder (repeats are not)


class Request:
    """One submitted request. Iterate it (for / async for) for its Deltas: text as it becomes
    final (text that could start a stop string is held back), the last one with finish_reason
    and the whole GenerationResult. Leaving the iteration early cancels the request."""

    def __init__(self, engine: Engine, prompt: list[int], params: SamplingParams,
                 start: float, keep_tokens: Sequence[int] = ()) -> None:
        # Everything that can fail is built here, before the engine runs anything (see submit).
        self.engine = engine
        self.prompt_tokens = prompt
        self.params = params
        self.tokens: list[int] = []         # output so far (no end-of-generation token)
        self.n_cached = 0                   # prompt tokens the prefix cache served
        self.n_drafted = 0                  # speculative drafts verified, and accepted
        self.n_accepted = 0
        self.dropped = Dropped()            # what fitting the prompt left out (context_fit)
        self.done = False                   # the final Delta has been produced
        self._handle: _core.EngineRequest | None = None  # None: max_tokens 0, or released
        self._id = 0
        self._decoder = _core.StreamDecoder(engine.tokenizer)
        # Control tokens whose text stays in the output (a tool-call format's markers); tokens
        # that decoding shows anyway are left to it.
        tokenizer = engine.tokenizer
        self._kept = {t: tokenizer.token_to_piece(t).decode("utf-8", errors="replace")
                      for t in keep_tokens if tokenizer.decode([t], skip_special=True) == ""}
        self._stops = _core.StopStringMatcher(list(params.stop))
        self._start = start
        self._first_token_at: float | None = None
        self._texts: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        self._pending_tokens: list[int] = []
        self._pending_logprobs: list[TokenLogprob] = []
        self._unsent = ""  # text of _pending_tokens, not yet in a Delta

    @property
    def id(self) -> int:
        return self._id

    def cancel(self) -> None:
        """Ends the request now and frees its KV blocks; a no-op once it is done. Also lets go
        of the C++ handle, so its wake-up descriptor closes now rather than whenever the
        garbage collector reaches a reference cycle holding this Request (an iteration in
        progress keeps its own reference until it ends)."""
        if not self.done and self._handle is not None:
            self.engine.cancel(self._handle.id)
        self.done = True
        self._handle = None

    # --- iteration -----------------------------------------------------------------------------

    # A consumer usually stops asking after the final Delta, leaving the iterator suspended at
    # its last yield until it is garbage collected (often much later: it sits in reference
    # cycles), and a cancellation's traceback keeps the iterator's frame and its locals. So the
    # iterators let go of the handle, whose wake-up descriptor is an open file, before they
    # hand out the final Delta and when they end.

    def __iter__(self) -> Iterator[Delta]:
        handle = self._handle
        try:
            if handle is None and not self.done:
                yield self._finish("length", None)
            while not self.done and handle is not None:
                for delta in self._feed(handle.next_events(None)):
                    if self.done:
                        handle = None
                        self.cancel()
                    yield delta
        finally:
            self.cancel()
            handle = None  # a traceback through here keeps this frame's locals

    async def __aiter__(self) -> AsyncIterator[Delta]:
        handle = self._handle
        if handle is None:
            if not self.done:
                yield self._finish("length", None)
            return
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        fd = handle.fileno()
        loop.add_reader(fd, ready.set)
        reading = True
        try:
            while not self.done:
                events = handle.drain()  # clears the fd first, so no wake-up is lost
                if not events:
                    ready.clear()
                    await ready.wait()
                    continue
                for delta in self._feed(events):
                    if self.done:
                        loop.remove_reader(fd)
                        reading, handle = False, None
                        self.cancel()
                    yield delta
        finally:
            if reading:
                loop.remove_reader(fd)
            self.cancel()
            handle = None  # a traceback through here (cancellation) keeps this frame's locals

    def result(self) -> GenerationResult:
        """Runs the request to its end (blocking) and returns its result."""
        result = None
        for delta in self:
            result = delta.result or result
        assert result is not None  # the last Delta always carries it
        return result

    # --- events -> deltas ----------------------------------------------------------------------

    def _feed(self, events: Sequence[_core.TokenEvent]) -> Iterator[Delta]:
        for event in events:
            if self.done:
                return
            yield from self._one(event)

    def _one(self, event: _core.TokenEvent) -> Iterator[Delta]:
        if self._first_token_at is None:
            self._first_token_at = perf_counter()
        self.n_cached = event.n_cached_tokens
        self.n_drafted, self.n_accepted = event.n_drafted_tokens, event.n_accepted_tokens
        reason = event.finish_reason
        if reason == "error":
            self.done = True
            raise EngineError(event.error or "the engine failed the request")
        token = event.token
        if token is not None and reason != "stop":  # a stop token is not part of the output
            self.tokens.append(token)
            self._pending_tokens.append(token)
            if self.params.logprobs and event.logprobs is not None:
                entry = self._logprob(token, event.logprobs)
                self._logprobs.append(entry)
                self._pending_logprobs.append(entry)
            piece = self._decoder.push(token)
            if token in self._kept:
                piece += self._kept[token]
            # Stop strings, like stop tokens, wait for min_tokens (as vLLM's stop checker does).
            text, stopped, matched = self._stops.push(piece) \
                if len(self.tokens) > self.params.min_tokens else (piece, False, None)
            self._texts.append(text)
            self._unsent += text
            if stopped:
                self.engine.cancel(self.id)  # frees its blocks now
                yield self._finish("stop", matched)
                return
        if reason is not None:
            tail = self._stops.push(self._decoder.flush())[0] + self._stops.flush()
            self._texts.append(tail)
            self._unsent += tail
            yield self._finish(reason, None)
        elif self._unsent:
            usage, timings = self._so_far(perf_counter())
            delta = Delta(self._unsent, self._pending_tokens, self._pending_logprobs,
                          usage=usage, timings=timings)
            self._unsent, self._pending_tokens, self._pending_logprobs = "", [], []
            yield delta

    def _logprob(self, token: int, lp: tuple[float, list[tuple[int, float]]]) -> TokenLogprob:
        def entry(token_id: int, logprob: float) -> TokenLogprob:
            raw = self.engine.tokenizer.token_to_piece(token_id)
            return TokenLogprob(token_id, raw.decode("utf-8", errors="replace"), raw, logprob)

        chosen = entry(token, lp[0])
        chosen.top = [entry(t, v) for t, v in lp[1][: self.params.top_logprobs]]
        return chosen

    def _usage(self, n_prompt: int, n_out: int) -> Usage:
        usage = Usage(n_prompt, n_out, n_prompt + n_out, self.n_cached,
                      dropped_tokens=self.dropped.tokens, dropped_messages=self.dropped.messages)
        if self.params.prediction is not None:
            usage.accepted_prediction_tokens = self.n_accepted
            usage.rejected_prediction_tokens = self.n_drafted - self.n_accepted
        return usage

    def _so_far(self, now: float) -> tuple[Usage, Timings]:
        """The usage and timings of the request up to `now`."""
        first = self._first_token_at or now
        prompt_s, generation_s = first - self._start, now - first
        n_prompt, n_out = len(self.prompt_tokens), len(self.tokens)
        return self._usage(n_prompt, n_out), Timings(
            prompt_ms=prompt_s * 1e3,
            prompt_tokens_per_s=(n_prompt - self.n_cached) / prompt_s if prompt_s > 0 else 0.0,
            generation_ms=generation_s * 1e3,
            tokens_per_s=(n_out - 1) / generation_s if generation_s > 0 and n_out > 1 else 0.0,
        )

    def _finish(self, finish_reason: str, stop_string: str | None) -> Delta:
        """The final Delta, with the text not streamed yet and the whole result."""
        self.done = True
        self.engine.last_sequence = [*self.prompt_tokens, *self.tokens]
        usage, timings = self._so_far(perf_counter())
        result = GenerationResult(
            text="".join(self._texts),
            tokens=self.tokens,
            finish_reason=finish_reason,
            usage=usage,
            timings=timings,
            logprobs=self._logprobs if self.params.logprobs else None,
            stop_string=stop_string,
        )
        delta = Delta(self._unsent, self._pending_tokens, self._pending_logprobs, finish_reason,
                      result, usage, timings)
        self._unsent, self._pending_tokens, self._pending_logprobs = "", [], []
        return delta


class Engine:
    """A model served by the continuous-batching engine, with its tokenizer. Thread-safe:
    submit and iterate from any number of threads (or from an asyncio loop); the C++ engine
    thread computes without the GIL.

    The engine's options are an EngineOptions (`options`, else the defaults) with any of its
    fields given as keywords on top (see engine_options and help(ember.EngineOptions)): n_ctx,
    parallel, kv_size / kv_bytes, block_size, max_batch_tokens, max_queue (past it submit
    raises EngineBusy), prefix_caching, kv_type, batch_invariant, speculative decoding (spec,
    draft_model, draft_max, draft_min, spec_adaptive: the output is the same, only sooner; a
    request whose SamplingParams carry a prediction drafts from it), mmproj (a vision
    projector: prompts may hold images, see tokenize_images and submit), n_threads and device (None
    reads $EMBER_DEVICE). lora: LoRA adapters by name ({"french": "french.gguf"}, see `ember
    convert --lora`), loaded once; each request picks one (or none) with SamplingParams' lora
    and lora_scale, and requests of different adapters share the engine's batches."""

    def __init__(self, model_path: str | Path, options: EngineOptions | None = None, *,
                 chat_template: str | None = None,
                 lora: Mapping[str, str | Path] | None = None, **fields: Any) -> None:
        self.path = Path(model_path)
        # LoRA adapters by name (-> .gguf, see `ember convert --lora`), loaded once; a request
        # picks one with SamplingParams(lora=NAME, lora_scale=...).
        self.lora: dict[str, Path] = {str(k): Path(v) for k, v in (lora or {}).items()}
        for name, adapter in self.lora.items():
            if not name:
                raise ValueError("a LoRA adapter needs a name")
            if not adapter.is_file():
                raise FileNotFoundError(f"LoRA adapter {name!r}: no such file {str(adapter)!r}")
        # A built-in template's name or a template file (ember.chat.builtin), resolved now so
        # that a bad one fails before the model loads.
        self._chat_template_override = (builtin.resolve(chat_template)
                                        if chat_template is not None else None)
        self.options = engine_options(options, **fields)
        draft_model = self.options.draft_model
        if draft_model is not None and not Path(draft_model).is_file():
            raise FileNotFoundError(f"draft model {draft_model!r}: no such file")
        mmproj = self.options.mmproj
        if mmproj is not None and not Path(mmproj).is_file():
            raise FileNotFoundError(f"vision projector (mmproj) {mmproj!r}: no such file")
        self._core = _core.Engine(str(self.path), self.options,
                                  lora=[str(p) for p in self.lora.values()])
        self._lora_index = {name: i for i, name in enumerate(self.lora)}
        self.tokenizer = _core.Tokenizer(str(self.path))
        self.last_sequence: list[int] = []  # prompt and output of the request that ended last
        self.stop_token_ids = [t for t in range(self.tokenizer.n_vocab) if self.tokenizer.is_eog(t)]
        projector = self._core.vision_model
        self._vision = ImagePrompts(projector, self.tokenizer) if projector is not None else None
        self._chat_template: ChatTemplate | None = None
        self._grammars: GrammarCompiler | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (the chat_template given, else the GGUF's, else its
        architecture's built-in, else ChatML), read on first use."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_gguf(self.path, self._chat_template_override)
        return self._chat_template

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles constraints for this model's vocabulary (built on first use)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer)
        return self._grammars

    # --- sizes ---------------------------------------------------------------------------------

    n_ctx = CoreAttribute[int]("Tokens one request may reach (prompt and output).")
    n_vocab = CoreAttribute[int]()
    device = CoreAttribute[str]('The device the model runs on: "cpu", or e.g. "vulkan:0 (AMD '
                                'Radeon ...)".')
    device_memory = CoreAttribute[Optional[tuple[int, int]]](
        "(total, free) bytes of the device's memory; None on the CPU.")
    parallel = CoreAttribute[int]("Requests running at once.")
    kv_size = CoreAttribute[int]("Tokens the KV cache holds.")
    kv_type = CoreAttribute[str]('The KV cache\'s element type: "f16" or "q8_0".')
    n_threads = CoreAttribute[int]()

    # --- requests ------------------------------------------------------------------------------

    def tokenize(self, prompt: Prompt, add_special: bool = True, parse_special: bool = False
                 ) -> list[int]:
        """Token ids of a text (add_special: BOS/EOS as the vocabulary asks; parse_special:
        control-token texts such as "<|im_start|>" become those tokens), or ids as given."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special, parse_special))
        return [int(t) for t in prompt]

    def check_prompt(self, tokens: Sequence[int]) -> None:
        """Raises InvalidRequest (a ValueError) for a prompt that can never run, PromptTooLong
        for one longer than the context: the engine's own check, as submit makes it."""
        self._core.check_prompt(list(tokens))

    @property
    def vision(self) -> bool:
        """Whether the engine takes images (a vision projector is loaded); see ember.media."""
        return self._vision is not None

    def tokenize_images(self, text: str, images: Sequence[Any], add_special: bool = True,
                        parse_special: bool = True) -> list[int]:
        """The prompt tokens of a text whose MEDIA_MARKERs stand for `images` (RGB uint8
        arrays, see ember.media), each marker expanded to the model's run of image tokens (its
        begin token, one soft token per embedding, its end token: llama.cpp mtmd's framing).
        The text between markers is tokenized piece by piece, as mtmd does (BOS before the
        first only). ValueError when the markers and images differ in number."""
        if self._vision is None:
            raise ValueError("this model takes no images (it has no vision projector)")
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"the prompt has {len(pieces) - 1} image markers but "
                             f"{len(images)} images were given")
        tokens: list[int] = []
        for i, piece in enumerate(pieces):
            if i > 0:
                tokens += self._vision.image_tokens(images[i - 1], i - 1)
            if piece or (i == 0 and add_special):
                tokens += self.tokenize(piece, add_special and i == 0, parse_special)
        return tokens

    def submit(self, prompt_tokens: Sequence[int], params: SamplingParams | None = None, *,
               priority: int = 0, keep_tokens: Sequence[int] = (),
               dropped: Dropped | None = None, images: Sequence[Any] = ()) -> Request:
        """Queues one request and returns it (iterate it for its Deltas). Raises ValueError for
        a request that can never run (InvalidRequest for a bad prompt, PromptTooLong for one over
        the context; ValueError for bad parameters), EngineBusy when the queue is full.
        keep_tokens: control tokens whose text stays in the output (decoding drops control
        tokens otherwise), such as a tool-call format's [TOOL_CALLS]."""
        params = params or SamplingParams()
        if images and not self.vision:
            raise ValueError("this model takes no images (it has no vision projector)")
        tokens = [int(t) for t in prompt_tokens]
        core_tokens, core_images = (self._vision.request_images(tokens, images) if images
                                    else (tokens, []))
        # The Request (stop strings, decoder) and the C++ parameters are built before the engine
        # is told anything: a failure here leaves nothing running.
        request = Request(self, tokens, params, perf_counter(), keep_tokens)
        request.dropped = dropped or Dropped()
        grammar = self.grammars.compile(params.constraint) if params.constraint else None
        if params.max_tokens == 0:
            self.check_prompt(tokens)  # what the engine's submit would check
            return request
        core_params = params.to_core()
        max_tokens = params.max_tokens if params.max_tokens is not None else self.n_ctx
        stop_ids = [] if params.ignore_eos else self.stop_token_ids
        stop_ids = stop_ids + [t for t in params.stop_token_ids if t not in stop_ids]
        request._handle = handle = self._core.submit(
            core_tokens, core_params, max_tokens=max_tokens, stop_token_ids=stop_ids,
            logprobs=params.top_logprobs if params.logprobs else -1, priority=priority,
            grammar=grammar, prediction=self._prediction_tokens(params.prediction),
            post_sampling_probs=params.post_sampling_probs, reuse_prefix=params.cache_prompt,
            lora_adapter=self.lora_index(params.lora), lora_scale=params.lora_scale,
            images=core_images)
        request._id = handle.id
        return request

    def lora_index(self, name: str | None) -> int:
        """The engine's index of LoRA adapter `name` (-1 for None); ValueError naming an
        unknown one and the loaded ones."""
        if name is None:
            return -1
        if name not in self._lora_index:
            loaded = ", ".join(self._lora_index) or "none"
            raise ValueError(f"unknown LoRA adapter {name!r} (loaded: {loaded})")
        return self._lora_index[name]

    def _prediction_tokens(self, prediction: str | Sequence[int] | None) -> list[int]:
        if prediction is None:
            return []
        if isinstance(prediction, str):
            return list(self.tokenizer.encode(prediction, False, False))
        return list(prediction)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               add_special: bool = True) -> Iterator[Delta]:
        """One request's Deltas (blocking). Closing the iterator early cancels the request."""
        return iter(self.submit(self.tokenize(prompt, add_special), params))

    def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                 add_special: bool = True) -> GenerationResult:
        return self.submit(self.tokenize(prompt, add_special), params).result()

    def generate_batch(self, prompts: Sequence[Prompt],
                       params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                       add_special: bool = True, dropped: Sequence[Dropped] = ()
                       ) -> list[GenerationResult]:
        """Runs every prompt at once (all are submitted before any result is read) and returns
        their results in order. `params` is one SamplingParams for all, or one per prompt. If
        one request fails, the others are cancelled and the error is raised. dropped: per
        prompt, what fitting it into the context left out (submit's)."""
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(prompts)
        else:
            per_prompt = list(params)
            if len(per_prompt) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
        requests: list[Request] = []
        try:
            cuts = list(dropped) or [Dropped()] * len(prompts)
            for prompt, p, cut in zip(prompts, per_prompt, cuts):
                requests.append(self.submit(self.tokenize(prompt, add_special), p, dropped=cut))
            return [request.result() for request in requests]
        finally:
            for request in requests:
                request.cancel()

    def cancel(self, request_id: int) -> None:
        """Ends a request and frees its KV blocks; unknown or finished ids are ignored."""
        self._core.cancel(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(**self._core.stats())

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int]) -> tuple[int, int]:
        """Writes `tokens` and the K/V of their leading full blocks still in the prefix cache
        (those of a request that just ran) to a state file; returns (tokens whose K/V it holds,
        bytes written). ValueError when it cannot be written."""
        return self._core.save_state(list(tokens), os.fspath(path))

    def load_state(self, path: str | os.PathLike[str]) -> tuple[list[int], int, int]:
        """Reads a state file into the prefix cache, so that a prompt starting with its tokens
        evaluates only what follows them; returns (its tokens, tokens now cached, bytes read).
        ValueError naming what is wrong with a bad file (another model or KV type, corrupt,
        truncated)."""
        tokens, _, n_restored, n_bytes = self._core.load_state(os.fspath(path))
        return list(tokens), n_restored, n_bytes

    def close(self) -> None:
        """Stops the engine thread; unfinished requests end 'cancelled'."""
        self._core.shutdown()

    def __enter__(self) -> Engine:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
