"""llama-server's native API, so its clients (its web UI, SillyTavern, llama.vim/llama.vscode,
scripts) work unchanged: POST /completion (and /completions, its alias there; OpenAI's stays at
/v1/completions), /infill, /apply-template, GET /props (/embedding is server/embeddings.py,
/rerank server/rerank.py). Shapes follow llama-server's tools/server README and source
(server-task.cpp): the response's `content`, `tokens`, `stop`, `stop_type`, `stopping_word`,
`tokens_cached`, `tokens_evaluated`, `generation_settings` and `timings`; streams send
`data: {json}` events, the last with `stop: true` and the whole summary, and no `[DONE]`.

Requests run on the same path as OpenAI's (respond.respond) with the same field checks
(protocol.parse_options, fields.py); the differences are the prompt forms (text, token ids, or
both mixed: fields.Fields.token_prompts) and n_predict defaulting to no limit.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.build_info import build_info
from ember.context_fit import Dropped
from ember.images import ImageRef
from ember.openai_format import dropped_fields
from ember.results import Delta, GenerationResult, Timings, TokenLogprob, Usage
from ember.sampling import SamplingParams
from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, json_response
from ember.server.fields import SAMPLER_ORDER, Fields
from ember.server.prompts import (
    image_prompt,
    infill_tokens,
    prompt_tokens,
    render_chat,
    request_fit,
)
from ember.server.protocol import Options, parse_messages, parse_options, split_prefill
from ember.server.reasoning import parse_request as parse_reasoning
from ember.server.respond import Generation, respond, sse

_LLAMA_STAGE_NAMES = {"top_k": "top_k", "typical_p": "typ_p", "top_p": "top_p",
                      "min_p": "min_p", "temperature": "temperature"}


# --- responses ---------------------------------------------------------------------------------

def generation_settings(params: SamplingParams, n_ctx: int, model: str, stream: bool,
                        n_probs: int, timings_per_token: bool = False,
                        adapters: tuple[str, ...] = ()) -> dict[str, Any]:
    """llama-server's generation_settings (and /props' params) for ember's parameters; the
    features ember lacks show their "off" values. `adapters`: the served LoRA adapters' names,
    in id order (params.lora is one of them)."""
    n_predict = params.max_tokens if params.max_tokens is not None else -1
    stages = [_LLAMA_STAGE_NAMES[s] for s in SAMPLER_ORDER if {
        "top_k": params.top_k > 0, "typical_p": params.typical_p < 1, "top_p": params.top_p < 1,
        "min_p": params.min_p > 0, "temperature": True}[s]]
    return {
        "n_ctx": n_ctx, "model": model, "n_predict": n_predict,
        "seed": params.seed if params.seed is not None else 0xFFFFFFFF,
        "temperature": params.temperature, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
        "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
        "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": params.typical_p,
        "repeat_last_n": params.repeat_last_n, "repeat_penalty": params.repeat_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty, "dry_multiplier": 0.0,
        "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
        "dry_sequence_breakers": ["\n", ":", "\"", "*"], "mirostat": 0, "mirostat_tau": 5.0,
        "mirostat_eta": 0.1, "top_n_sigma": -1.0, "stop": list(params.stop),
        "max_tokens": n_predict, "n_keep": 0, "n_discard": 0, "ignore_eos": params.ignore_eos,
        "stream": stream, "n_probs": n_probs, "min_keep": 0,
        "post_sampling_probs": params.post_sampling_probs, "timings_per_token": timings_per_token,
        "lora": ([{"id": adapters.index(params.lora), "scale": params.lora_scale}]
                 if params.lora in adapters else []),
        "grammar": "", "grammar_lazy": False,
        "samplers": stages,
        # As llama-server lists them; a banned token's -inf is null there (JSON has no -inf).
        "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t}
                       for t, b in sorted(params.logit_bias.items())],
    }


def timings_json(usage: Usage, t: Timings) -> dict[str, Any]:
    """llama-server's `timings` of a request so far (server-common.cpp's slot stats): the
    per-token figures of generation count the tokens after the first, which comes with the
    prompt's last step."""
    prompt_n = usage.prompt_tokens - usage.cached_tokens
    n_steps = max(0, usage.completion_tokens - 1)
    return {
        "cache_n": usage.cached_tokens, "prompt_n": prompt_n, "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": t.prompt_tokens_per_s,
        "predicted_n": usage.completion_tokens, "predicted_ms": t.generation_ms,
        "predicted_per_token_ms": t.generation_ms / n_steps if n_steps else 0.0,
        "predicted_per_second": t.tokens_per_s,
    }


def prompt_progress(usage: Usage, t: Timings) -> dict[str, Any]:
    """llama-server's `prompt_progress` once the prompt is done (ember's engine reports a
    request's first event when its whole prompt has run, so this is the only one)."""
    return {"total": usage.prompt_tokens, "cache": usage.cached_tokens,
            "processed": usage.prompt_tokens, "time_ms": int(t.prompt_ms)}


def probs_json(entries: list[TokenLogprob], post_sampling: bool) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities: logprobs of the raw logits, or with
    post_sampling_probs the probabilities after the sampler chain (`prob`, `top_probs`)."""
    value, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def one(e: TokenLogprob) -> dict[str, Any]:
        return {"id": e.token, "token": e.text, "bytes": list(e.bytes),
                value: math.exp(e.logprob) if post_sampling else e.logprob}

    return [{**one(e), top: [one(t) for t in e.top]} for e in entries]


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    result: GenerationResult | None = None
    started: bool = False  # its first Delta was streamed


class NativeShape:
    """/completion's answers: one object per choice (an array when there are several)."""

    def __init__(self, ctx: AppContext, options: Options, prompt_texts: list[str],
                 n_prompt_tokens: list[int], n_ctx: int) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self._options = options
        self._model = ctx.model_name
        self._adapters = ctx.lora.names
        self._prompts = prompt_texts  # one per choice
        self._n_prompt_tokens = n_prompt_tokens
        self._n_ctx = n_ctx
        self._choices = [_Choice() for _ in prompt_texts]

    def _summary(self, index: int, content: str, stream: bool) -> dict[str, Any]:
        choice, o = self._choices[index], self._options
        result = choice.result
        assert result is not None
        reason = result.finish_reason
        stop_type = ("word" if result.stop_string is not None else "eos") if reason == "stop" \
            else "limit"
        usage = result.usage
        out: dict[str, Any] = {
            "index": index, "content": content,
            "tokens": choice.tokens if o.return_tokens and not stream else [],
            "id_slot": -1, "stop": True, "model": self._model,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "generation_settings": generation_settings(
                o.params, self._n_ctx, self._model, stream, o.top_logprobs, o.timings_per_token,
                self._adapters),
            "prompt": self._prompts[index], "has_new_line": "\n" in result.text,
            "truncated": usage.prompt_tokens + usage.completion_tokens >= self._n_ctx
            or usage.dropped_tokens > 0,
            "stop_type": stop_type, "stopping_word": result.stop_string or "",
            "tokens_cached": usage.cached_tokens,
            "timings": timings_json(result.usage, result.timings),
            **dropped_fields(usage),
        }
        if o.logprobs and not stream:
            out["completion_probabilities"] = probs_json(choice.logprobs, o.post_sampling_probs)
        return out

    def add(self, index: int, delta: Delta) -> None:
        choice = self._choices[index]
        choice.text.append(delta.text)
        choice.tokens += delta.tokens
        choice.logprobs += delta.logprobs
        if delta.result is not None:
            choice.result = delta.result

    def response(self) -> Any:
        out = [self._summary(i, "".join(c.text), stream=False)
               for i, c in enumerate(self._choices)]
        return out[0] if len(out) == 1 else out

    def stream_start(self) -> list[bytes]:
        return []

    def _chunk(self, index: int, content: str, tokens: list[int]) -> dict[str, Any]:
        return {"index": index, "content": content, "tokens": tokens, "stop": False,
                "id_slot": -1, "tokens_predicted": len(self._choices[index].tokens),
                "tokens_evaluated": self._n_prompt_tokens[index]}

    def stream_delta(self, index: int, delta: Delta) -> list[bytes]:
        choice, o = self._choices[index], self._options
        out = []
        if o.return_progress and not choice.started and delta.usage and delta.timings:
            progress = self._chunk(index, "", [])
            progress["prompt_progress"] = prompt_progress(delta.usage, delta.timings)
            out.append(sse(progress))
        choice.started = True
        choice.tokens += delta.tokens
        if delta.text or delta.tokens:
            chunk = self._chunk(index, delta.text, delta.tokens)
            if o.timings_per_token and delta.usage and delta.timings:
                chunk["timings"] = timings_json(delta.usage, delta.timings)
            if o.logprobs:
                chunk["completion_probabilities"] = probs_json(delta.logprobs,
                                                               o.post_sampling_probs)
            out.append(sse(chunk))
        if delta.result is not None:
            choice.result = delta.result
            out.append(sse(self._summary(index, "", stream=True)))
        return out

    def stream_end(self) -> list[bytes]:
        return []

    def stream_error(self, error: APIError) -> list[bytes]:
        return [sse(error.body())]


# --- endpoints ---------------------------------------------------------------------------------

async def _options(request: HTTPRequest, ctx: AppContext, body: dict[str, Any]) -> Options:
    engine = ctx.require_ready()
    return await ctx.offload(request, parse_options, Fields(body), chat=False,
                             n_vocab=engine.n_vocab, n_ctx=engine.n_ctx, defaults=ctx.defaults,
                             native=True)


async def _generate(request: HTTPRequest, ctx: AppContext, options: Options,
                    prompts: list[list[int]], arrival: float,
                    dropped: Sequence[Dropped] = (), images: Sequence[Any] = ()) -> Response:
    engine = ctx.require_ready()
    n = options.n
    texts = [engine.tokenizer.decode(p, skip_special=False) for p in prompts for _ in range(n)]
    all_prompts = [p for p in prompts for _ in range(n)]
    shape = NativeShape(ctx, options, texts, [len(p) for p in all_prompts], engine.n_ctx)
    params = [options.choice_params(i) for _ in prompts for i in range(n)]
    cuts = [d for d in dropped for _ in range(n)]
    return await respond(request, ctx, shape,
                         Generation(all_prompts, params, options.stream, dropped=cuts,
                                    images=images), arrival)


async def completion(request: HTTPRequest, ctx: AppContext) -> Response:
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    engine = ctx.require_ready()
    pieces = await ctx.offload(request, Fields(body).token_prompts, "prompt",
                               n_vocab=engine.n_vocab, mixed=True)
    options = await _options(request, ctx, body)
    refs = [piece for p in pieces for piece in p if isinstance(piece, ImageRef)]
    if refs:  # {"prompt_string": ..., "multimodal_data": [...]}: images for its markers
        if len(pieces) > 1:
            raise bad_request("'prompt': a prompt with multimodal_data must be the request's "
                              "only prompt", param="prompt", code="invalid_value")
        tokens, images = await image_prompt(ctx, pieces[0][0], refs, "prompt")
        return await _generate(request, ctx, options, [tokens], arrival, images=images)
    fitted = [await prompt_tokens(ctx, p, fit=request_fit(ctx, options)) for p in pieces]
    return await _generate(request, ctx, options, [tokens for tokens, _ in fitted], arrival,
                           [dropped for _, dropped in fitted])


def _extra_chunks(body: Fields) -> list[tuple[str, str]]:
    extra = body.get("input_extra")
    if extra is None:
        return []
    ok = isinstance(extra, list) and all(
        isinstance(e, Mapping) and isinstance(e.get("text", ""), str)
        and isinstance(e.get("filename", ""), str) for e in extra)
    if not ok:
        raise bad_request("'input_extra' must be an array of {\"filename\": string, \"text\": "
                          "string}", param="input_extra", code="invalid_type")
    return [(e.get("filename", ""), e.get("text", "")) for e in extra]


async def infill(request: HTTPRequest, ctx: AppContext) -> Response:
    """Code infilling with the model's FIM tokens (fim.py); a 400 for a model without them."""
    arrival = time.perf_counter()
    body = await ctx.read_json(request)
    fields = Fields(body)
    prefix = fields.string("input_prefix") or ""
    suffix = fields.string("input_suffix") or ""
    prompt = fields.string("prompt") or ""
    extra = _extra_chunks(fields)
    tokens = infill_tokens(ctx, prefix, suffix, "input_prefix", prompt, extra)
    return await _generate(request, ctx, await _options(request, ctx, body), [tokens], arrival)


async def apply_template(request: HTTPRequest, ctx: AppContext) -> Response:
    body = await ctx.read_json(request)
    ctx.require_ready()
    messages = await ctx.offload(request, parse_messages, body)
    rendered, prefill, add_prompt = split_prefill(Fields(body), messages)
    kwargs = parse_reasoning(body).template_kwargs
    prompt = await ctx.in_worker(render_chat, ctx, rendered, prefill=prefill,
                                 add_generation_prompt=add_prompt, tokenize=False,
                                 within_context=False, template_kwargs=kwargs)
    return json_response({"prompt": prompt.text})


def default_settings(ctx: AppContext) -> dict[str, Any]:
    """What a request that sets nothing gets (/props' and /slots' params)."""
    engine = ctx.require_ready()
    n_predict = ctx.config.n_predict
    params = SamplingParams(**ctx.config.sampling,
                            max_tokens=None if n_predict in (None, -1) else n_predict)
    return generation_settings(params, engine.n_ctx, ctx.model_name, False, 0)


async def props(request: HTTPRequest, ctx: AppContext) -> Response:
    engine = ctx.require_ready()
    template = ctx.template
    assert template is not None
    return json_response({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": engine.n_ctx, "speculative": False,
            "is_processing": False, "params": default_settings(ctx), "prompt": "",
            "next_token": {"has_next_token": True, "has_new_line": False, "n_remain": -1,
                           "n_decoded": 0, "stopping_word": ""}},
        "total_slots": engine.parallel,
        "model_path": str(engine.path),
        "model_alias": ctx.model_name,
        "chat_template": template.source,
        "chat_template_caps": {},
        "bos_token": template.bos_token,
        "eos_token": template.eos_token,
        "modalities": {"vision": engine.vision, "audio": False},
        "build_info": build_info(),
        "is_sleeping": False,
    })
