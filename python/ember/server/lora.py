"""LoRA adapters in the server. `ember serve BASE --lora NAME=FILE` loads them with the model; a
request picks one with llama-server's `lora` field ([{"id", "scale"}], adapters not listed at
scale 0), else by model name ("<served name>:NAME", scale 1), else runs with the global scales.
GET /lora-adapters lists them as llama-server does ([{id, path, scale}]); POST sets the global
scales (llama-server's semantics: adapters not listed go to 0) and answers {"success": true}.

ember runs one adapter per request (requests of different adapters share the engine's
batches), so a `lora` list or POST with more than one non-zero scale is a 400. The global scales
start at 0 (llama-server's --lora-init-without-apply): a request that picks nothing runs the
plain model. An unknown id or adapter name is a 400 naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from ember.server.errors import APIError, bad_request, json_response
from ember.server.fields import Fields, show


def split_model_name(model: str) -> tuple[str, str | None]:
    """'base:NAME' -> ('base', 'NAME'); a name without a ':NAME' suffix -> (name, None). The one
    place a request's model name is split into the model and its adapter."""
    base, sep, adapter = model.rpartition(":")
    if not sep or not base or not adapter:
        return model, None
    return base, adapter


@dataclass(frozen=True)
class LoraTable:
    """The served adapters, in id order, and their global scales."""

    names: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    scales: tuple[float, ...] = ()

    def listing(self) -> list[dict[str, Any]]:
        return [{"id": i, "path": p, "scale": s} for i, (p, s) in enumerate(zip(self.paths, self.scales))]


def parse_scales(value: Any, table: LoraTable, param: str) -> list[float]:
    """llama-server's [{"id": i, "scale": s}, ...] as a scale per adapter (0 where not listed);
    400s naming the entry for a bad shape, an unknown id or a scale that is not a number."""
    if not isinstance(value, list):
        raise bad_request(f"'{param}' must be an array of {{\"id\", \"scale\"}} objects, got "
                          f"{show(value)}", param=param, code="invalid_type")
    scales = [0.0] * len(table.names)
    for i, entry in enumerate(value):
        where = f"{param}[{i}]" if param else f"[{i}]"
        if not isinstance(entry, Mapping) or "id" not in entry:
            raise bad_request(f"'{where}.id': each entry must be {{\"id\": adapter id, \"scale\": "
                              "number}", param=f"{where}.id", code="invalid_type")
        index, scale = entry["id"], entry.get("scale", 0.0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(scales):
            loaded = f"ids 0..{len(scales) - 1} are loaded" if scales else "ember loads none"
            raise bad_request(f"'{where}.id': no LoRA adapter {show(index)} is loaded ({loaded})",
                              param=f"{where}.id", code="invalid_value")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise bad_request(f"'{where}.scale' must be a finite number, got {show(scale)}",
                              param=f"{where}.scale", code="invalid_type")
        scales[index] = float(scale)
    return scales


def _one_adapter(scales: Sequence[float], table: LoraTable, param: str) -> tuple[str | None, float]:
    chosen = [(i, s) for i, s in enumerate(scales) if s != 0]
    if len(chosen) > 1:
        raise bad_request(f"'{param}': adapters {', '.join(str(i) for i, _ in chosen)} have non-zero "
                          "scales; ember applies one LoRA adapter per request", param=param or None,
                          code="unsupported_parameter")
    if not chosen:
        return None, 1.0
    return table.names[chosen[0][0]], chosen[0][1]


def choose_adapter(body: Fields, model: str | None, table: LoraTable) -> tuple[str | None, float]:
    """The request's adapter (None: the plain model) and its scale."""
    lora = body.get("lora")
    if lora is not None:
        return _one_adapter(parse_scales(lora, table, "lora"), table, "lora")
    if model is not None and table.names:
        _, name = split_model_name(model)
        if name is not None:
            if name not in table.names:
                raise bad_request(f"'model': no LoRA adapter {name!r} is loaded (model {model!r}; "
                                  f"loaded: {', '.join(table.names)})", param="model",
                                  code="model_not_found")
            return name, 1.0
    return _one_adapter(table.scales, table, "")


async def list_adapters(request: HTTPRequest, ctx: Any) -> Response:
    """GET /lora-adapters: [{id, path, scale}] of the served adapters, scale the global one."""
    ctx.require_ready()
    return json_response(ctx.lora.listing())


async def set_adapters(request: HTTPRequest, ctx: Any) -> Response:
    """POST /lora-adapters [{"id", "scale"}]: the global scales (those not listed: 0)."""
    body = await ctx.read_json(request, top=list)
    ctx.require_ready()
    scales = parse_scales(body, ctx.lora, "")
    try:
        _one_adapter(scales, ctx.lora, "")
    except APIError as err:
        raise bad_request(err.message, code="unsupported_parameter") from None
    ctx.set_lora_scales(scales)
    return json_response({"success": True})
