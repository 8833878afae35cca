"""The API key (--api-key): every route but PUBLIC_PATHS needs it, as "Authorization: Bearer
KEY" or, as Anthropic's clients send it, "x-api-key: KEY" (compared in constant time)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from ember.server.errors import APIError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/"})  # "/": the chat page (no data)


def _given_key(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
        if name == b"x-api-key":
            return value.strip()
    return b""


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = _given_key(scope)
        if not hmac.compare_digest(given, self._key):
            message = ("a valid API key is required: send 'Authorization: Bearer KEY' (or "
                       "'x-api-key: KEY')" if not given else "the API key is not valid")
            response = APIError(401, message, code="invalid_api_key").response()
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
