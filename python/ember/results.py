"""What a generation gives back: streamed Deltas, then one GenerationResult with its Usage,
Timings and (when asked) TokenLogprobs. Produced by ember.engine, consumed by ember.LLM, the CLI
and the server (ember.openai_format shapes them for OpenAI clients)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV cache entries were reused, not evaluated
    # With a prediction (Predicted Outputs): its tokens the output kept, and those it verified
    # and turned down (they still cost a forward row, as OpenAI's "rejected" ones are billed).
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    # What fitting the prompt into the context left out (ember.context_fit): tokens of the
    # prompt as it came, not counted in prompt_tokens, and whole messages of a chat.
    dropped_tokens: int = 0
    dropped_messages: int = 0


@dataclass
class Timings:
    prompt_ms: float            # from submission to the first token: queueing, the uncached
                                # part of the prompt, and sampling the first token
    prompt_tokens_per_s: float
    generation_ms: float        # from the first generated token to the last
    tokens_per_s: float         # tokens after the first per second of generation_ms


@dataclass
class TokenLogprob:
    """A token's log-probability under the model's raw logits, as OpenAI reports it."""

    token: int
    text: str     # its bytes decoded as UTF-8, broken sequences as U+FFFD
    bytes: bytes
    logprob: float
    top: list[TokenLogprob] = field(default_factory=list)  # the most likely tokens at this step


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]       # generated ids; an end-of-generation token is not among them
    finish_reason: str      # "stop" (end token or stop string) or "length" (max_tokens, context)
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None  # one per generated token when asked for
    stop_string: str | None = None              # the stop string that ended the text


@dataclass
class Delta:
    """A piece of streamed output: new text and the tokens that produced it. Text that could be
    the start of a stop string is held back, so some tokens arrive with the next piece of text.
    The last delta carries finish_reason and the whole result."""

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: str | None = None
    result: GenerationResult | None = None
    # The request's counts and timings so far (llama-server's timings_per_token and prompt
    # progress read them); on the last Delta those of the result.
    usage: Usage | None = None
    timings: Timings | None = None
