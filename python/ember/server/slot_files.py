"""llama-server's POST /slots/{id_slot}?action=save|restore|erase: a slot's prompt state (its
last request's prompt and output tokens and their K/V, whole KV blocks) saved to a state file
under --slot-save-path, and read back into the prefix cache, where the slot's next request (or
any request with that prefix) reuses it. Files are ember's state files (ember.kv state_file: a
checked header naming the model and KV type), written and read by the engine."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ember.server.context import AppContext
from ember.server.errors import APIError, bad_request, json_response
from ember.server.fields import Fields
from ember.server.slots import SlotView

ACTIONS = ("save", "restore", "erase")


async def slot_action(request: Request, ctx: AppContext) -> Response:
    engine = ctx.require_ready()
    save_dir = ctx.config.slot_save_path
    if save_dir is None:
        raise APIError(501, "this server does not save slots: start it with --slot-save-path DIR",
                       code="not_supported", error_type="not_supported_error")
    raw_id = request.path_params["id_slot"]
    if not raw_id.isdigit() or int(raw_id) >= len(ctx.slots.views):
        raise bad_request(f"slot id {raw_id!r} is not one of 0 .. {len(ctx.slots.views) - 1}",
                          param="id_slot", code="invalid_slot")
    view = ctx.slots.views[int(raw_id)]
    action = request.query_params.get("action")
    if action not in ACTIONS:
        raise bad_request(f"action must be one of {', '.join(ACTIONS)} (?action=...), got "
                          f"{action!r}", param="action", code="invalid_action")
    if action == "erase":
        return json_response(_erase(view))
    body = await ctx.read_json(request)
    fields = Fields(body)
    fields.only(frozenset({"filename"}), f"/slots/{{id}}?action={action}")
    filename = fields.required_string("filename")
    if (not filename or filename in (".", "..") or "/" in filename or "\\" in filename
            or "\0" in filename):
        raise bad_request(f"filename {filename!r} must be a plain file name (no path separator), "
                          "inside --slot-save-path", param="filename", code="invalid_filename")
    path = Path(save_dir) / filename
    start = perf_counter()
    if action == "save":
        if view.request is not None:
            raise APIError(409, f"slot {view.id} is processing a request; save it when idle",
                           code="slot_busy")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            n_saved, n_written = await ctx.in_worker(engine.save_state, path, view.tokens)
        except (OSError, ValueError) as err:
            raise APIError(500, f"the slot file could not be written: {err}",
                           code="slot_save_failed") from None
        return json_response({"id_slot": view.id, "filename": filename, "n_saved": n_saved,
                              "n_written": n_written,
                              "timings": {"save_ms": (perf_counter() - start) * 1e3}})
    if not path.is_file():
        raise APIError(404, f"no saved slot file {filename!r} in --slot-save-path",
                       param="filename", code="not_found")
    try:
        tokens, n_restored, n_read = await ctx.in_worker(engine.load_state, path)
    except ValueError as err:  # another model's, corrupt, truncated: the engine says which
        raise bad_request(str(err), param="filename", code="invalid_slot_file") from None
    view.tokens, view.n_cached_tokens = tokens, n_restored
    return json_response({"id_slot": view.id, "filename": filename, "n_restored": n_restored,
                          "n_read": n_read,
                          "timings": {"restore_ms": (perf_counter() - start) * 1e3}})


def _erase(view: SlotView) -> dict[str, Any]:
    """Forgets the slot's tokens (a later save has nothing to write). Their blocks stay in the
    shared prefix cache, evictable: other requests may share them."""
    n_erased = len(view.tokens)
    view.tokens, view.n_cached_tokens = [], 0
    return {"id_slot": view.id, "n_erased": n_erased}
