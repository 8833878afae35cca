"""Prompts, from a request's messages or text to checked tokens: the chat template (tools
included, ember.tools.prompt), text and token-id prompts, fill-in-the-middle prompts (fim.py).

Every prompt a generation endpoint runs is made here, and checked here once, where its tokens
are known: not UTF-8, empty, or longer than the context is a 400 naming the request's field.
Texts are first held against PromptBound, which refuses a text certainly too long before
tokenizing it. A chat's images (image_parts.py) are read and decoded first; the rendered text
then holds a marker per image, which Engine.tokenize_images expands (ember.media).
Rendering runs in a worker thread; short texts are tokenized on the event loop,
longer ones in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from starlette.requests import Request as HTTPRequest

from ember.chat.limits import RenderLimits
from ember.chat.template import ChatTemplateError, ChatTemplateLimitError
from ember.context_fit import Dropped, fit_chat, fit_tokens
from ember.grammar import Constraint
from ember.images import ImageRef, refs_in
from ember.server import reasoning
from ember.server.context import AppContext
from ember.server.errors import bad_request, context_exceeded
from ember.server.fields import check_text
from ember.server.fim import infill_prompt
from ember.server.fim import require as require_fim
from ember.server.image_parts import Pixels, load_images
from ember.server.prompt_bound import PromptBound
from ember.server.protocol import ChatCompletionRequest, Options, parse_chat_request
from ember.tools import prompt as tool_prompt
from ember.tools.calls import ToolFormat
from ember.tools.request import ToolRequest

_INLINE_TOKENIZE_CHARS = 4096


def _check_tokens(ctx: AppContext, tokens: list[int], param: str) -> list[int]:
    n_ctx = ctx.require_ready().n_ctx
    if not tokens:
        raise bad_request("the prompt is empty (it has no tokens to start from)", param=param,
                          code="empty_prompt")
    if len(tokens) > n_ctx:
        raise context_exceeded(
            f"the prompt has {len(tokens)} tokens, more than the model's context of {n_ctx} "
            "tokens (which prompt and completion share); shorten the prompt", param,
            len(tokens), n_ctx)
    return tokens


def _bound(ctx: AppContext) -> PromptBound:
    ctx.require_ready()
    assert ctx.bound is not None  # set with the engine
    return ctx.bound


def render_limits(bound: PromptBound) -> RenderLimits:
    """Request-time limits of the chat template: 1 s, and no more output than could fit the
    context (PromptBound), so a long conversation stops rendering once it is certainly too
    long."""
    return RenderLimits(max_seconds=1.0, max_chars=bound.max_bytes,
                        max_total_chars=max(16 * bound.max_bytes, 4 << 20))


@dataclass
class ChatPrompt:
    text: str
    tokens: list[int]                       # empty unless asked for (render_chat's tokenize)
    tool_format: ToolFormat | None = None   # parse the answer for tool calls in this format
    keep_tokens: list[int] = field(default_factory=list)  # control tokens kept as text
    answer_prefix: str = ""  # the answer's opening (a forced call's), ending the prompt
    constraint: Constraint | None = None  # a forced call: what the answer must be
    thinking: reasoning.Thinking | None = None  # read the answer's thinking out (chat_request)
    dropped: Dropped = field(default_factory=Dropped)  # what fitting it into the context left out
    images: list[np.ndarray] = field(default_factory=list)  # the pixels of its markers, in order


@dataclass(frozen=True)
class Fit:
    """How a prompt is fitted into the context (ember.context_fit): the policy, the request's
    max_tokens (the answer's room) and n_keep (truncate-middle's first tokens)."""

    policy: str = "error"
    max_tokens: int | None = None
    n_keep: int | None = None

    @property
    def fits(self) -> bool:
        """Does the prompt get fitted (rather than refused when too long)?"""
        return self.policy != "error"


def request_fit(ctx: AppContext, options: Options, policy: str | None = None) -> Fit:
    """A request's Fit: `policy` (an API's own field), else the server's --context-overflow."""
    return Fit(policy or ctx.config.context_overflow, options.params.max_tokens, options.n_keep)


def _bos(ctx: AppContext) -> int | None:
    bos = ctx.require_ready().tokenize("", add_special=True, parse_special=False)
    return bos[0] if bos else None


def render_chat(ctx: AppContext, messages: list[dict[str, Any]], *, prefill: str | None = None,
                add_generation_prompt: bool = True, tools: ToolRequest | None = None,
                tokenize: bool = True, within_context: bool = True,
                template_kwargs: dict[str, Any] | None = None,
                fit: Fit | None = None, pixels: Pixels | None = None) -> ChatPrompt:
    """Checked messages (and tools) in the model's chat template; runs in a worker thread
    (ctx.in_worker). Tools go into the messages (ember.tools.prompt), the template renders
    under its limits, `prefill` (the reply's opening) follows the rendered text, then the
    tokens (`tokenize`). within_context: a generation's prompt, bounded by the context (the
    render's size and the token count); a 400 naming `messages` when the template refuses
    them or runs past its limits. template_kwargs: more variables of the template (vLLM's
    chat_template_kwargs); the tools' own win. fit (a generation's, tokenized): a policy
    other than "error" fits the prompt into the context instead of refusing it, rendering
    the kept messages again (ChatPrompt.dropped says what went). pixels (image_parts.
    load_images'): the messages' images, whose markers the engine tokenizes (the kept
    messages' images only)."""
    engine = ctx.require_ready()
    template = ctx.template
    assert template is not None
    bound = _bound(ctx)
    fitting = fit is not None and fit.fits and within_context and tokenize
    limits = render_limits(bound) if within_context and not fitting else RenderLimits()
    renders: dict[int, tuple[str, tool_prompt.PreparedChat]] = {}  # by the messages kept

    def render(kept: list[dict[str, Any]]) -> tuple[str, tool_prompt.PreparedChat]:
        if len(kept) in renders:
            return renders[len(kept)]
        try:
            chat = tool_prompt.prepare_chat(template, engine.tokenizer, kept, tools)
            text = template.render(chat.messages, add_generation_prompt=add_generation_prompt,
                                   limits=limits,
                                   **{**(template_kwargs or {}), **chat.variables}) \
                + (prefill or "") \
                + chat.answer_prefix
        except ChatTemplateLimitError as err:
            if err.kind == "size":
                raise bound.too_long("messages", f"more text than that ({err})",
                                     bound.max_bytes + 1) from None
            raise bad_request(f"the chat template took too long on these messages ({err})",
                              param="messages", code="chat_template_timeout") from None
        except ChatTemplateError as err:
            raise bad_request(str(err), param="messages", code="invalid_messages") from None
        check_text(text, "messages")
        renders[len(kept)] = text, chat
        return text, chat

    def images_of(kept: list[dict[str, Any]]) -> list[np.ndarray]:
        return [pixels[id(ref)] for ref in refs_in(kept)] if pixels else []

    def tokenize_text(text: str, kept: list[dict[str, Any]]) -> list[int]:
        if not pixels:
            return template.tokenize(engine.tokenizer, text)
        try:
            return engine.tokenize_images(text, images_of(kept))
        except ValueError as err:  # e.g. a marker typed into the text as well
            raise bad_request(f"'messages': {err}", param="messages",
                              code="invalid_messages") from None

    dropped = Dropped()
    kept = messages
    if fitting:
        assert fit is not None

        def tokens_of(kept: list[dict[str, Any]]) -> list[int]:
            return tokenize_text(render(kept)[0], kept)

        kept, tokens, dropped = fit_chat(messages, tokens_of, fit.policy, engine.n_ctx,
                                         fit.max_tokens, fit.n_keep, _bos(ctx))
        text, chat = render(kept)
        _check_tokens(ctx, tokens, "messages")
    else:
        text, chat = render(messages)
        if within_context:
            bound.check(text, "messages")
        tokens = tokenize_text(text, messages) if tokenize else []
        if tokenize and within_context:
            _check_tokens(ctx, tokens, "messages")
    return ChatPrompt(text, tokens, chat.format, chat.keep_tokens, chat.answer_prefix,
                      chat.constraint.grammar(ctx.config.json_bounds) if chat.constraint is not None
                      else None, dropped=dropped, images=images_of(kept))


async def chat_request(request: HTTPRequest, ctx: AppContext, body: dict[str, Any],
                       thinking_budget: int | None = None, overflow: str | None = None
                       ) -> tuple[ChatCompletionRequest, ChatPrompt]:
    """A chat-shaped body (OpenAI's, or another API's translated to it) parsed and rendered:
    the request and its checked prompt (tokens, and how to read tool calls and thinking). A
    forced tool call's constraint goes into the sampling parameters; a reasoning model's
    constraint and thinking budget apply after its thinking (reasoning.py). thinking_budget:
    the API's own field (Anthropic's thinking.budget_tokens), read already; overflow: the
    API's own context-overflow policy (Responses' truncation), else the server's."""
    engine = ctx.require_ready()
    parsed = await ctx.offload(request, parse_chat_request, body, engine.n_vocab, engine.n_ctx,
                               ctx.defaults)
    config = ctx.config
    asks = reasoning.parse_request(body, config.reasoning_format,
                                   None if config.reasoning_budget < 0 else config.reasoning_budget,
                                   thinking_budget)
    pixels = await load_images(ctx, refs_in(parsed.messages))
    prompt = await ctx.in_worker(render_chat, ctx, parsed.messages, prefill=parsed.prefill,
                                 add_generation_prompt=parsed.add_generation_prompt,
                                 tools=parsed.tools, template_kwargs=asks.template_kwargs,
                                 fit=request_fit(ctx, parsed.options, overflow), pixels=pixels)
    params = parsed.options.params
    if prompt.constraint is not None:
        params = replace(params, constraint=prompt.constraint)
    assert ctx.template is not None
    thinks = reasoning.is_reasoning_template(ctx.template.source)
    if not thinks and body.get("reasoning_budget_tokens") not in (None, -1):
        raise bad_request("'reasoning_budget_tokens': this model does not think (its chat "
                          "template has no </think>)", param="reasoning_budget_tokens",
                          code="unsupported_parameter")
    if thinks:
        opened = reasoning.starts_open(prompt.text)
        before = reasoning.starts_open(prompt.text[:len(prompt.text) - len(parsed.prefill or "")])
        prompt.thinking = reasoning.Thinking(asks.format, opened, before) if asks.parse else None
        if asks.enabled and (params.constraint is not None or asks.budget is not None):
            params = replace(params, constraint=reasoning.thinking_constraint(
                params.constraint, asks.budget, opened))
    parsed.options.params = params
    return parsed, prompt


async def text_tokens(ctx: AppContext, text: str, add_special: bool, parse_special: bool,
                      param: str, within_context: bool = True) -> list[int]:
    """The tokens of a text: a 400 naming `param` for text that is not UTF-8 or
    (within_context: a prompt) certainly longer than the context, checked before tokenizing."""
    engine = ctx.require_ready()
    check_text(text, param)
    if within_context:
        _bound(ctx).check(text, param)
    if len(text) <= _INLINE_TOKENIZE_CHARS:
        return engine.tokenize(text, add_special, parse_special)
    return await ctx.in_background(engine.tokenize, text, add_special, parse_special)


async def prompt_tokens(ctx: AppContext, pieces: Sequence[str | int], param: str = "prompt",
                        fit: Fit | None = None) -> tuple[list[int], Dropped]:
    """A checked prompt of text pieces and token ids (fields.token_prompts), fitted into the
    context under `fit` (ember.context_fit; what was dropped beside it): texts tokenized
    with control-token texts as those tokens (as ember.LLM reads a raw prompt); BOS (where
    the vocabulary adds it) only when the prompt starts with text, as llama-server does."""
    fitting = fit is not None and fit.fits
    out: list[int] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            out += await text_tokens(ctx, piece, add_special=i == 0, parse_special=True,
                                     param=param, within_context=not fitting)
        else:
            out.append(piece)
    dropped = Dropped()
    if fitting:
        assert fit is not None
        out, dropped = fit_tokens(out, fit.policy, ctx.require_ready().n_ctx, fit.max_tokens,
                                  fit.n_keep, _bos(ctx))
    return _check_tokens(ctx, out, param), dropped


async def image_prompt(ctx: AppContext, text: str, refs: Sequence[ImageRef], param: str
                       ) -> tuple[list[int], list[np.ndarray]]:
    """A checked text prompt whose MEDIA_MARKERs stand for `refs` (llama-server's
    multimodal_data): its tokens, image tokens included, and the images' pixels. It is not
    fitted into the context: one too long is a 400."""
    engine = ctx.require_ready()
    check_text(text, param)
    _bound(ctx).check(text, param)
    pixels = await load_images(ctx, refs)
    images = [pixels[id(ref)] for ref in refs]
    try:
        tokens = await ctx.in_worker(engine.tokenize_images, text, images)
    except ValueError as err:  # e.g. a marker count unlike the images'
        raise bad_request(f"'{param}': {err}", param=param, code="invalid_value") from None
    return _check_tokens(ctx, tokens, param), images


def infill_tokens(ctx: AppContext, prefix: str | Sequence[str | int], suffix: str, param: str,
                  prompt: str = "", extra: Sequence[tuple[str, str]] = (),
                  length_param: str | None = None) -> list[int]:
    """A checked fill-in-the-middle prompt (fim.py); a 400 naming `param` for a model without
    FIM tokens, or a prefix given as token ids (`length_param`, default `param`, for one
    longer than the context)."""
    engine = ctx.require_ready()
    fim = require_fim(ctx.fim, param)
    if not isinstance(prefix, str):
        raise bad_request(f"'{param}' needs the prompt as text, not token ids", param=param,
                          code="invalid_value")
    for text in (prefix, suffix, prompt, *(t for pair in extra for t in pair)):
        check_text(text, param)
        _bound(ctx).check(text, param)

    def tokenize(text: str) -> list[int]:
        return engine.tokenize(text, add_special=False, parse_special=False) if text else []

    bos = engine.tokenize("", add_special=True, parse_special=False)
    return _check_tokens(ctx, infill_prompt(fim, tokenize, prefix, suffix, prompt, extra, bos),
                         length_param or param)
