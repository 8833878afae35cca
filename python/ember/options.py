"""The engine's options as Python sees them: ember._core.EngineOptions, where every option and
its default is defined once (C++, engine/engine_options.h), and the one mapping of keyword
arguments onto it (engine_options). ember.Engine, ember.LLM, the CLI and the server's config
all build their EngineOptions here; EngineOptions.check() is the one check of the values."""

from __future__ import annotations

import os
from typing import Any

from ember import _core

EngineOptions = _core.EngineOptions
DEFAULTS = EngineOptions()  # read only: the defaults, for flags, help texts and configs


def resolve_device(device: str | None) -> str:
    """The device to run on: `device`, else $EMBER_DEVICE, else the engine's default ("auto")."""
    return device or os.environ.get("EMBER_DEVICE") or DEFAULTS.device


def engine_options(options: EngineOptions | None = None, **fields: Any) -> EngineOptions:
    """`options` (else the defaults) with `fields`, EngineOptions fields, on top. None keeps a
    field as it is (an unset n_ctx, kv_size, n_threads ... is the model's or the machine's
    default); device None reads $EMBER_DEVICE; a draft_model or mmproj path becomes a string. Raises
    TypeError for a name that is no option; the values are checked by check()."""
    values = {name: value for name, value in fields.items() if value is not None}
    for path_field in ("draft_model", "mmproj"):
        if path_field in values:
            values[path_field] = os.fspath(values[path_field])
    if options is None:
        values.setdefault("device", resolve_device(None))
        return EngineOptions(**values)
    return EngineOptions(**{**{n: getattr(options, n) for n in EngineOptions.field_names}, **values})
