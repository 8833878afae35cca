"""The /slots view of one model's engine (Slots): which live request shows in which of its
`parallel` places, llama-server's style. Bookkeeping only; the engine schedules by itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.engine import Request


@dataclass
class SlotView:
    """One of the `parallel` places a request runs in, llama-server's /slots style."""

    id: int
    request: Request | None = None   # the request it runs now
    request_id: str | None = None    # the HTTP-level id of that (or the last) request
    n_prompt_tokens: int = 0
    n_decoded: int = 0
    n_cached_tokens: int = 0         # tokens whose KV the slot left for prefix reuse

    def as_json(self, n_ctx: int) -> dict[str, Any]:
        busy = self.request is not None
        n_decoded = len(self.request.tokens) if self.request is not None else self.n_decoded
        return {"id": self.id, "state": "processing" if busy else "idle", "is_processing": busy,
                "request_id": self.request_id, "n_ctx": n_ctx,
                "n_prompt_tokens": self.n_prompt_tokens, "n_decoded": n_decoded,
                "n_cached_tokens": self.n_cached_tokens}


class Slots:
    """Which live request shows in which slot (bookkeeping for /slots and for shutdown; the
    engine schedules by itself). Requests beyond `parallel` wait for a slot in arrival order."""

    def __init__(self, n_slots: int) -> None:
        self.views = [SlotView(i) for i in range(n_slots)]
        self.live: dict[Request, str] = {}  # every unfinished request -> its HTTP-level id

    def add(self, request: Request, request_id: str) -> None:
        self.live[request] = request_id
        self._assign(request, request_id)

    def remove(self, request: Request) -> None:
        if self.live.pop(request, None) is None:
            return
        for view in self.views:
            if view.request is request:
                view.request = None
                view.n_decoded = len(request.tokens)
                view.n_cached_tokens = view.n_prompt_tokens + view.n_decoded
                waiting = [r for r in self.live if not any(v.request is r for v in self.views)]
                if waiting:
                    self._assign(waiting[0], self.live[waiting[0]])
                return

    def _assign(self, request: Request, request_id: str) -> None:
        for view in self.views:
            if view.request is None:
                view.request, view.request_id = request, request_id
                view.n_prompt_tokens, view.n_decoded = len(request.prompt_tokens), 0
                view.n_cached_tokens = 0
                return
