"""The Responses API's stored responses (`store: true`): in memory, the last MAX_STORED, for the
server's lifetime — what `previous_response_id` continues and GET /v1/responses/{id} returns."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ember.server.errors import APIError

MAX_STORED = 1024


class ResponseStore:
    """Responses stored with `store: true`: id -> (the conversation so far, the response)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = \
            OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        """Stores `response` with the chat messages it ends (its own output included)."""
        self._items[response["id"]] = (conversation, response)
        while len(self._items) > MAX_STORED:
            self._items.popitem(last=False)

    def get(self, response_id: str, status: int, param: str
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(the conversation including its answer, the response); `status` (400 or 404) when
        there is no such stored response."""
        if response_id not in self._items:
            raise APIError(status, f"no stored response '{response_id[:80]}' (responses are "
                           f"kept only when created with store: true, the last {MAX_STORED}, "
                           "until the server restarts)", param=param, code="response_not_found")
        return self._items[response_id]
