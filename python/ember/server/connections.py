"""Connection hygiene below the app: uvicorn's h11 protocol with ember's rules for connections
that never finish a request (uvicorn's own keep-alive timer starts only after a response, and
it has no limit on connections), and TCP_NODELAY on every connection.

- header_timeout: a connection must deliver a request's headers within this many seconds of
  opening (or of its previous response), or it is closed; the app bounds reading the body
  itself (AppContext.read_json, body_timeout).
- idle_timeout: uvicorn's keep-alive timeout, between a response and the next request.
- max_connections: connections past it are answered 503 (OpenAI's error shape, Retry-After,
  Connection: close) on their first request, and get 1 s instead of header_timeout to send it,
  so open descriptors stay near max_connections however many clients connect.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ember.server.errors import APIError

OVER_LIMIT_HEADER_TIMEOUT = 1.0


async def _over_limit(scope: Scope, receive: Receive, send: Send) -> None:
    error = APIError(503, "the server has too many open connections (--max-connections); "
                     "retry later", code="too_many_connections")
    response = error.response()
    response.headers["connection"] = "close"
    await response(scope, receive, send)


def protocol_class(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """The protocol for uvicorn.Config(http=...), with these limits."""

    class EmberProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                # asyncio sets this only for sockets made with proto IPPROTO_TCP; without it a
                # response's body waits ~40 ms for the ACK of its headers (Nagle + delayed ACK),
                # and so would every streamed token.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._header_timer: asyncio.TimerHandle | None = None
            timeout = header_timeout
            if len(self.connections) > max_connections:
                self.app: Any = _over_limit  # this connection's requests get the 503
                timeout = min(header_timeout, OVER_LIMIT_HEADER_TIMEOUT)
            self._arm_header_timer(timeout)

        def _arm_header_timer(self, timeout: float) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout, self._on_header_timeout)

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            in_request = self.cycle is not None and not self.cycle.response_complete
            if not in_request and not self.transport.is_closing():
                self.transport.close()  # no request (or only part of its headers) arrived

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer(header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return EmberProtocol
