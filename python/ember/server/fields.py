"""The one reader of request fields, for every API the server speaks: typed getters (Fields),
the parser of prompts given as text or token ids, and llama-server's fields that ember reads
on every generation endpoint.

One policy: a field's wrong type is a 400 with code invalid_type and the message "'NAME' must
be EXPECTED, got TYPE VALUE"; a value out of its range a 400 with code invalid_value naming
the field and its bounds; a known field ember cannot honour a 400 naming it (code
unsupported_parameter), never silently dropped. Fields that no API defines are ignored on the
generation endpoints (as OpenAI's server ignores them); an endpoint with a closed set of fields
(embeddings) refuses every other one (Fields.only). docs/server-fields.md lists every field.

llama-server's own fields: the ones that work are parsed in protocol.py (n_predict, ignore_eos,
cache_prompt, n_probs, post_sampling_probs, timings_per_token, return_progress, id_slot,
repeat_last_n, typical_p, n_cmpl, return_tokens) and here
(`samplers`). The ones ember cannot honour are accepted only at the value that turns them off
(OFF_VALUES); fields that only tune a feature that is off (mirostat_tau without mirostat,
dry_base without dry_multiplier, ...) are accepted as they change nothing.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

from ember.images import ImageRef
from ember.server.errors import APIError, bad_request

MAX_PROMPTS = 64

# What the C++ engine's types hold (sampling/params.h: int32 top_k, float temperature, ...).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 80, 80, 3


def show(value: Any) -> str:
    """A short repr for error messages: bounded in length and depth, whatever the client sent."""
    return _REPR.repr(value)


def type_name(value: Any) -> str:
    return "null" if value is None else {bool: "boolean", int: "integer", float: "number",
                                         str: "string", list: "array",
                                         dict: "object"}.get(type(value), type(value).__name__)


def check_text(text: str, param: str) -> None:
    """A 400 naming `param` when `text` cannot be UTF-8 (a lone surrogate, which JSON's \\udXXX
    escapes can spell but no tokenizer can read)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_request(f"'{param}' is not valid text: it holds a lone surrogate "
                          f"({show(err.object[err.start:err.end])} at character {err.start}), "
                          "which UTF-8 cannot encode", param=param, code="invalid_value") from None


def wrong_type(name: str, expected: str, got: Any) -> APIError:
    shown = "null" if got is None else f"{type_name(got)} {show(got)}"
    return bad_request(f"'{name}' must be {expected}, got {shown}", param=name,
                       code="invalid_type")


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"between {low} and {high}" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}")
        raise bad_request(f"'{name}' must be {bounds}, got {show(value)}", param=name,
                          code="invalid_value")


class Fields:
    """Typed reads of a JSON object's fields; wrong types raise a 400 naming the field.
    `where` prefixes the names in errors (a block inside a request: "messages[0]")."""

    def __init__(self, body: Mapping[str, Any], where: str = "") -> None:
        self.body = body
        self._where = where

    def get(self, name: str) -> Any:
        return self.body.get(name)

    def _name(self, name: str) -> str:
        return f"{self._where}.{name}" if self._where else name

    def _fail(self, name: str, expected: str) -> APIError:
        return wrong_type(self._name(name), expected, self.body.get(name))

    def only(self, accepted: frozenset[str], endpoint: str) -> None:
        """A 400 naming the first field outside `accepted` (an endpoint whose fields are a
        closed set)."""
        unknown = sorted(set(self.body) - accepted)
        if unknown:
            raise bad_request(f"unknown field '{unknown[0]}' for {endpoint} (accepted: "
                              f"{', '.join(sorted(accepted))})", param=unknown[0],
                              code="invalid_field")

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(name, "a boolean")
        return value

    def string(self, name: str) -> str | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def required_string(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def array(self, name: str, expected: str) -> list[Any] | None:
        """An array field; None when it is absent or empty."""
        value = self.body.get(name)
        if value is None or value == []:
            return None
        if not isinstance(value, list):
            raise self._fail(name, expected)
        return value

    def integer(self, name: str, low: int | None = None, high: int | None = None) -> int | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not _is_token(value):
            raise self._fail(name, "an integer")
        _check_range(self._name(name), value, low, high)
        return value

    def number(self, name: str, low: float | None = None,
               high: float | None = None) -> float | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, "a number")
        _check_range(self._name(name), value, low, high)
        # The engine stores these as float32: 1e400 (inf in Python's JSON) or 10**40 cannot be.
        if isinstance(value, int) and abs(value) > FLOAT32_MAX or (
                isinstance(value, float) and not abs(value) <= FLOAT32_MAX):
            raise bad_request(f"'{self._name(name)}' must be a finite number of at most "
                              f"{FLOAT32_MAX:.4g} in magnitude, got {show(value)}",
                              param=self._name(name), code="invalid_value")
        return float(value)

    def token_prompts(self, name: str, *, n_vocab: int | None = None, mixed: bool = False,
                      limit: int | None = MAX_PROMPTS) -> list[list[str | int]]:
        """The prompts of a field that takes text or token ids, each as its pieces (texts and
        token ids): "text"; [12, 34]; an array of those ([[12, 34], "c"]). `mixed`
        (llama-server's forms) adds one prompt of ids and texts ([12, "text", 34]) and
        {"prompt_string": text}. Token ids are checked against `n_vocab` where given (an
        embedding model checks its own)."""
        value = self.body.get(name)
        shape = ("a string, token ids, token ids mixed with strings, {\"prompt_string\": "
                 "...}, or an array of those" if mixed else
                 "a string, an array of strings, an array of token ids or an array of those")
        if value is None:
            raise bad_request(f"'{name}' must be {shape}; it is required", param=name,
                              code="missing_required")
        if isinstance(value, list) and not value:
            raise bad_request(f"'{name}' must be {shape} (non-empty)", param=name,
                              code="invalid_value")
        has_ids = isinstance(value, list) and any(_is_token(v) for v in value)
        if has_ids and not mixed and not all(_is_token(v) for v in value):
            raise bad_request(f"'{name}' must be {shape}, not a mix of text and token ids in "
                              f"one prompt; got {show(value)}", param=name, code="invalid_type")
        one = has_ids
        items = value if isinstance(value, list) and not one else [value]
        if limit is not None and len(items) > limit:
            raise bad_request(f"'{name}' has {len(items)} prompts; at most {limit} are allowed "
                              "per request", param=name, code="invalid_value")
        prompts = [self._pieces(name, item, shape, mixed) for item in items]
        for pieces in prompts:
            for piece in pieces:
                if isinstance(piece, str):
                    check_text(piece, name)
                elif isinstance(piece, ImageRef):
                    continue
                elif n_vocab is not None and not 0 <= piece < n_vocab:
                    raise bad_request(f"'{name}' token id {piece} is out of range [0, "
                                      f"{n_vocab})", param=name, code="invalid_value")
        return prompts

    @staticmethod
    def _pieces(name: str, item: Any, shape: str, mixed: bool) -> list[Any]:
        if isinstance(item, str):
            return [item]
        if mixed and isinstance(item, Mapping) and isinstance(item.get("prompt_string"), str):
            # llama-server's images: base64 strings, one per media marker of the text
            data = item.get("multimodal_data") or []
            if not (isinstance(data, list) and all(isinstance(d, str) for d in data)):
                raise bad_request(f"'{name}.multimodal_data' must be an array of base64 "
                                  "strings", param=f"{name}.multimodal_data",
                                  code="invalid_type")
            return [item["prompt_string"], *(ImageRef(d, f"{name}.multimodal_data[{k}]")
                                             for k, d in enumerate(data))]
        if isinstance(item, list) and all(_is_token(v) or mixed and isinstance(v, str)
                                           for v in item):
            return list(item)
        mix = " (not a mix of text and token ids in one prompt)" if isinstance(item, list) \
            else ""
        raise bad_request(f"'{name}' must be {shape}{mix}, got {show(item)}", param=name,
                          code="invalid_type")


# --- llama-server's fields ---------------------------------------------------------------------

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
