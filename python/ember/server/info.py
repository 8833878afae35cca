"""What the server tells about itself: GET /health, /v1/models (and /v1/models/NAME),
/metrics (Prometheus text) and /slots (llama-server's view of the running requests).

/health answers 503 while the model loads, then 200 {"status": "ok"}. With one model served, a
request's `model` may name anything: it is answered by the served model, under its id (the
first --alias, else the file name), as llama-server does. /v1/models lists the id and the
other aliases; GET /v1/models/NAME answers for those names and the file's (404 else).

With several models (models.py), /health is the server's (200 once it listens; ?model=NAME
tells that model's state), /v1/models lists every model with its status (unloaded, loading,
loaded) without loading any, /metrics has the server's counters plus ember_model_loaded{model}
(engine gauges for ?model=NAME), and /slots, /props need ?model=NAME (and load it).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ember.server.context import AppContext
from ember.server.errors import APIError, json_response
from ember.server.llama_api import default_settings
from ember.server.metrics import CONTENT_TYPE
from ember.server.models import ModelEntry


async def health(request: Request, ctx: AppContext) -> Response:
    """The server's health; ?model=NAME: that model's (200 loaded or loadable, 404 unknown),
    which never loads it."""
    name = request.query_params.get("model")
    if name is not None and not ctx.single:
        entry = ctx.models.resolve(name)
        return json_response({"status": "ok", "model": entry.name, "state": entry.status})
    status, message = ctx.health()
    if status == "ok":
        return json_response({"status": "ok"})
    code = "shutting_down" if status == "shutting_down" else f"model_{status}"
    err = APIError(503, message, code=code)
    return json_response({"status": status, **err.body()}, 503, err.headers())


def _model_card(ctx: AppContext, name: str) -> dict[str, Any]:
    engine = ctx.require_ready()
    return {"id": name, "object": "model", "created": ctx.created,
            "owned_by": "ember",
            "meta": {"file": ctx.model_path.name, "n_ctx": engine.n_ctx,
                     "n_vocab": engine.n_vocab, "n_slots": engine.parallel}}


def _entry_card(ctx: AppContext, entry: ModelEntry) -> dict[str, Any]:
    """A model of several: its status (llama-server's router: unloaded, loading, loaded) and,
    once loaded, its sizes."""
    card: dict[str, Any] = {"id": entry.name, "object": "model", "created": ctx.created,
                            "owned_by": "ember", "path": str(entry.model.path),
                            "status": entry.card()}
    loaded = entry.loaded
    if loaded is not None and loaded.engine is not None:
        engine = loaded.engine
        card["meta"] = {"file": loaded.path.name, "n_ctx": engine.n_ctx,
                        "n_vocab": engine.n_vocab, "n_slots": engine.parallel}
    if entry.footprint_bytes is not None:
        card["memory_bytes"] = entry.footprint_bytes
    return card


async def list_models(request: Request, ctx: AppContext) -> Response:
    if not ctx.single:  # every model, loaded or not: listing loads none
        return json_response({"object": "list",
                              "data": [_entry_card(ctx, e) for e in ctx.models.entries]})
    ctx.require_ready()
    return json_response({"object": "list",
                          "data": [_model_card(ctx, name) for name in ctx.model_names]})


async def get_model(request: Request, ctx: AppContext) -> Response:
    name = request.path_params["model"]
    if not ctx.single:
        return json_response(_entry_card(ctx, ctx.models.resolve(name)))
    ctx.require_ready()
    path = ctx.model_path
    if name not in {*ctx.model_names, path.name, path.stem}:
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                       f"'{ctx.model_name}'", param="model", code="model_not_found")
    return json_response(_model_card(ctx, name if name in ctx.model_names else ctx.model_name))


async def metrics(request: Request, ctx: AppContext) -> Response:
    """The server's counters; the engine gauges of its model (with several: of ?model=NAME,
    none without), and ember_model_loaded{model} per model. Loads nothing."""
    name = request.query_params.get("model")
    entry = ctx.models.resolve(name) if ctx.single or name is not None else None
    engine = entry.loaded.engine if entry is not None and entry.loaded is not None else None
    stats = engine.stats() if engine is not None else None
    memory = getattr(engine, "device_memory", None)
    loaded = {e.name: e.loaded is not None for e in ctx.models.entries}
    return Response(ctx.metrics.render(stats, memory, loaded), media_type=CONTENT_TYPE)


async def slots(request: Request, ctx: AppContext) -> Response:
    """ember's slot view plus llama-server's fields (id_task, speculative, params, next_token);
    ?fail_on_no_slot=1 answers 503 when every slot is busy, as llama-server does."""
    engine = ctx.require_ready()
    views = ctx.slots.views
    if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(
            v.request is not None for v in views):
        raise APIError(503, "no slot is available", code="no_slot_available")
    params = default_settings(ctx)
    out = []
    for view in views:
        slot = view.as_json(engine.n_ctx)
        out.append({**slot, "id_task": view.request.id if view.request is not None else -1,
                    "speculative": False, "params": params,
                    "next_token": {"has_next_token": view.request is not None,
                                   "has_new_line": False, "n_remain": -1,
                                   "n_decoded": slot["n_decoded"], "stopping_word": ""}})
    return json_response(out)


