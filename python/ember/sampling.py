"""What a request asks of the sampler and of the generation loop, as one dataclass.

The sampling itself runs in C++ (ember._core.Sampler); this module only validates the Python-side
fields and builds that sampler. Defaults follow llama.cpp's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from ember import _core

MAX_TOP_LOGPROBS = 20  # as OpenAI allows


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
    likely alternatives.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int | None = None
    stop: str | Sequence[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        # JSON object keys are strings: accept {"123": -100} as OpenAI clients send it.
        try:
            self.logit_bias = {int(k): float(v) for k, v in dict(self.logit_bias).items()}
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}") from None

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    def make_sampler(self, n_vocab: int) -> _core.Sampler:
        """The C++ sampler for these parameters; raises ValueError for out-of-range values."""
        seed = self.seed if self.seed is not None else random.SystemRandom().getrandbits(64)
        return _core.Sampler(
            n_vocab,
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            typical_p=self.typical_p, repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, logit_bias=dict(self.logit_bias), seed=seed,
        )
