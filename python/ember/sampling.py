"""What a request asks of the sampler and of the generation loop, as one dataclass.

The sampling fields and their defaults are defined once, in C++ (sampling/params.h, bound as
ember._core.SamplingParams): the defaults below are read from it, and to_core() hands the
values back to it. This class adds what the Python side owns: stop strings, max_tokens,
logprobs, and seed=None meaning "a fresh random seed". Defaults follow llama.cpp's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from ember import _core
from ember.grammar import Constraint

MAX_TOP_LOGPROBS = 20  # as OpenAI allows



def _default(name: str) -> float:
    """The C++ default of a field; floats as the shortest decimal that rounds to the same
    float32 (0.8, not 0.800000011920929)."""
    value = getattr(_core.SamplingParams(), name)
    return float(f"{value:.7g}") if isinstance(value, float) else value


@dataclass
class SamplingParams:
    """Sampling and stopping for one request.

    temperature <= 0 is greedy. top_k <= 0, top_p = 1, min_p = 0, typical_p = 1,
    repeat_penalty = 1 and zero presence/frequency penalties switch those stages off. The
    penalties look at the last repeat_last_n tokens of prompt and output (-1: all of them).
    seed=None draws a fresh seed; the same seed, prompt and parameters give the same text.
    max_tokens=None generates until an end-of-generation token or a full context. Stop strings
    end the text before them and are never part of it. logprobs adds the log-probability of
    each generated token (log-softmax of the model's raw logits) and its top_logprobs most
    likely alternatives. constraint (a JSON schema, GBNF/Lark grammar or regex, see
    ember.grammar) limits every generated token to what it allows; end-of-generation tokens
    only come where the text is complete. stop_token_ids end the output as end-of-generation
    tokens do; min_tokens holds all of them back for that many tokens.
    """

    temperature: float = _default("temperature")
    top_k: int = _default("top_k")
    top_p: float = _default("top_p")
    min_p: float = _default("min_p")
    typical_p: float = _default("typical_p")
    repeat_penalty: float = _default("repeat_penalty")
    repeat_last_n: int = _default("repeat_last_n")
    presence_penalty: float = _default("presence_penalty")
    frequency_penalty: float = _default("frequency_penalty")
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int | None = None
    stop: str | Sequence[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False  # generate past end-of-generation tokens (benchmarks, llama-server's field)
    # More tokens that end the output when sampled (vLLM's stop_token_ids; like EOS, not part of
    # the text), and how many tokens come before any stop token may (vLLM's min_tokens).
    stop_token_ids: Sequence[int] = field(default_factory=list)
    min_tokens: int = _default("min_tokens")
    constraint: Constraint | None = None
    # Predicted Outputs: the text (or token ids) the output is expected to be, e.g. the file being
    # edited. The engine drafts from it; the output is the same as without it, only sooner.
    prediction: str | Sequence[int] | None = None
    # The logprobs are of the distribution the token is drawn from, after logit bias,
    # penalties, the filters and temperature (llama-server's post_sampling_probs); the
    # alternatives are at most top_logprobs of the tokens the chain kept.
    post_sampling_probs: bool = False
    # False: the prompt is computed in full, no prefix-cache hit (llama-server's cache_prompt).
    cache_prompt: bool = True
    # A LoRA adapter of the engine's (a name given to ember.Engine / ember.LLM's lora=), and the
    # factor on its low-rank product (llama-server's scale; alpha / rank comes on top); None:
    # the plain model. Requests of different adapters share the engine's batches.
    lora: str | None = None
    lora_scale: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = [s for s in self.stop if s]
        for s in self.stop:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"stop string {s!r} is not valid text (it holds a lone "
                                 "surrogate)") from None
        if self.prediction is not None and not isinstance(self.prediction, str):
            try:
                self.prediction = [int(t) for t in self.prediction]
            except (TypeError, ValueError):
                raise ValueError("prediction must be text or a list of token ids, got "
                                 f"{self.prediction!r}"[:200]) from None
        try:
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        except (TypeError, ValueError):
            raise ValueError("stop_token_ids must be a list of token ids, got "
                             f"{self.stop_token_ids!r}"[:200]) from None
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be an ember.grammar.Constraint, got {self.constraint!r}"[:200])
        if self.lora is not None and not isinstance(self.lora, str):
            raise ValueError(f"lora must be an adapter's name, got {self.lora!r}"[:200])
        if not isinstance(self.lora_scale, (int, float)) or not math.isfinite(self.lora_scale):
            raise ValueError(f"lora_scale must be a finite number, got {self.lora_scale!r}"[:200])
        # JSON object keys are strings: accept {"123": -100} as OpenAI clients send it.
        try:
            self.logit_bias = {int(k): float(v) for k, v in dict(self.logit_bias).items()}
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}") from None

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    def to_core(self) -> _core.SamplingParams:
        """The C++ sampler's parameters (a fresh random seed when seed is None). Raises
        ValueError for values the C++ types cannot hold."""
        core = _core.SamplingParams()
        values = {name: getattr(self, name) for name in _core.SamplingParams.field_names}
        values["logit_bias"] = sorted(self.logit_bias.items())
        if self.seed is None:
            values["seed"] = random.SystemRandom().getrandbits(64)
        for name, value in values.items():
            try:
                setattr(core, name, value)
            except TypeError:
                raise ValueError(f"{name} is out of range: {value!r}"[:200]) from None
        return core

    def check(self, n_vocab: int) -> None:
        """Raises ValueError for out-of-range values (the C++ checks), before anything runs."""
        self.to_core().validate(n_vocab)
