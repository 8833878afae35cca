"""llama-server's own request fields, read on every generation endpoint (llama-server reads them
on its OpenAI endpoints too, so its clients send them there).

The ones that work are parsed in protocol.py (n_predict, ignore_eos, cache_prompt, n_probs,
id_slot, repeat_last_n, typical_p, n_cmpl, return_tokens) and here (`samplers`). The ones
ember cannot honour are accepted only at the value that turns them off and are a 400 naming
them otherwise (OFF_VALUES); never silently dropped. Fields that only tune a feature that is
off (mirostat_tau without mirostat, dry_base without dry_multiplier, ...) are accepted as they
change nothing. docs/server-fields.md lists every field with its status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ember.server.errors import bad_request

# field -> (the values meaning "off", what ember lacks)
OFF_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "dynatemp_range": ((0,), "dynamic temperature"),
    "mirostat": ((0,), "mirostat sampling"),
    "dry_multiplier": ((0,), "DRY repetition penalty"),
    "xtc_probability": ((0,), "XTC sampling"),
    "min_keep": ((0,), "min_keep (ember's samplers keep at least one token)"),
    "n_indent": ((0,), "n_indent (indentation-based stopping)"),
    "t_max_predict_ms": ((0,), "a time limit on generation"),
    "n_cache_reuse": ((0,), "KV shifting of reused chunks (ember's prefix cache reuses whole "
                      "blocks of a shared prefix without it)"),
    "post_sampling_probs": ((False,), "probabilities after the sampler chain (logprobs are of "
                            "the raw logits)"),
    "timings_per_token": ((False,), "timings in every streamed chunk (the last one has them)"),
    "return_progress": ((False,), "prompt-progress events"),
    "lora": (([],), "LoRA adapters"),
    "response_fields": (([],), "response_fields (the whole response is sent)"),
}

# Sampler stages in the order ember's sampler runs them (sampling/sampler.cpp), by llama-server's
# names and one-letter codes, and the parameters that turn each off.
SAMPLER_ORDER = ("top_k", "typical_p", "top_p", "min_p", "temperature")
_SAMPLER_NAMES = {
    "top_k": "top_k", "k": "top_k", "typ_p": "typical_p", "typical_p": "typical_p",
    "typical": "typical_p", "y": "typical_p", "top_p": "top_p", "p": "top_p", "min_p": "min_p",
    "m": "min_p", "temperature": "temperature", "temp": "temperature", "t": "temperature",
    # Stages ember lacks; listing them is harmless while their parameters keep them off.
    "dry": None, "d": None, "xtc": None, "x": None, "penalties": None,
}
_STAGE_OFF: dict[str, Any] = {"top_k": 0, "typical_p": 1.0, "top_p": 1.0, "min_p": 0.0,
                              "temperature": 1.0}


def _is_off(value: Any, off: tuple[Any, ...]) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return any(value == v and (number or type(value) is type(v)) for v in off)


def check_off(body: Mapping[str, Any]) -> None:
    """A 400 naming the first field of OFF_VALUES set to a value that turns its feature on."""
    for name, (off, what) in OFF_VALUES.items():
        value = body.get(name)
        if value is None or _is_off(value, off):
            continue
        shown = "false" if off[0] is False else repr(off[0])
        raise bad_request(f"'{name}': {what} is not supported by ember; omit the field or send "
                          f"{shown}", param=name, code="unsupported_parameter")


def sampler_overrides(value: Any) -> dict[str, Any]:
    """llama-server's `samplers` (names, or a string of one-letter codes): the parameters that
    switch off the stages it leaves out. ember's stages run in SAMPLER_ORDER; another order is
    a 400 rather than a silently different chain."""
    if isinstance(value, str):
        names: list[Any] = list(value)
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = value
    else:
        raise bad_request("'samplers' must be an array of sampler names (\"top_k\", \"typ_p\", "
                          "\"top_p\", \"min_p\", \"temperature\") or a string of their letters",
                          param="samplers", code="invalid_type")
    stages = []
    for name in names:
        if name not in _SAMPLER_NAMES:
            raise bad_request(f"'samplers': unknown sampler {name[:40]!r}; known: "
                              f"{', '.join(k for k in _SAMPLER_NAMES if len(k) > 1)}",
                              param="samplers", code="invalid_value")
        if _SAMPLER_NAMES[name] is not None:
            stages.append(_SAMPLER_NAMES[name])
    positions = [SAMPLER_ORDER.index(s) for s in stages]
    if positions != sorted(set(positions)):
        raise bad_request(f"'samplers': ember's sampler runs {', '.join(SAMPLER_ORDER)} in that "
                          f"order, each at most once; got {', '.join(stages)}",
                          param="samplers", code="unsupported_parameter")
    return {stage: off for stage, off in _STAGE_OFF.items() if stage not in stages}
