"""Connection hygiene below the app: uvicorn's h11 protocol with ember's rules for connections
that never finish a request (uvicorn's own keep-alive timer starts only after a response, and
it has no limit on connections), malformed HTTP, and TCP_NODELAY on every connection.

- header_timeout: a connection must deliver a request's headers within this many seconds of
  opening (or of its previous response), or it is closed; the app bounds reading the body
  itself (AppContext.read_json, body_timeout).
- idle_timeout: uvicorn's keep-alive timeout, between a response and the next request.
- max_connections: past it, a new connection closes the one that has been idle longest (no
  request in flight: a kept-alive connection, or one still sending its headers, as idle and
  trickling "slowloris" clients do), so clients with requests keep being served however many
  idle sockets are held (nginx drains its idle connections the same way). Only when every open
  connection has a request in flight is the newcomer answered 503 (OpenAI's error shape,
  Retry-After, Connection: close) on its first request, with 1 s instead of header_timeout to
  send it; open descriptors stay near max_connections however many clients connect.
- Malformed HTTP (a bad chunk size, request line or header): a 400 in OpenAI's shape naming
  h11's reason, and the connection closed. When a response already went out (the app answered
  before reading the whole body), the connection is only closed: uvicorn would try to send a
  second response there and fail with h11's LocalProtocolError (a traceback in the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from http import HTTPStatus
from typing import Any

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ember.server.errors import APIError

log = logging.getLogger("ember.server")

OVER_LIMIT_HEADER_TIMEOUT = 1.0


async def _over_limit(scope: Scope, receive: Receive, send: Send) -> None:
    error = APIError(503, "the server has too many open connections (--max-connections); "
                     "retry later", code="too_many_connections")
    response = error.response()
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class _Connection(h11.Connection):
    """h11's connection, keeping the reason of the last malformed input (uvicorn drops it)."""

    protocol_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as err:
            self.protocol_error = err
            raise


def _bad_request_bytes(conn: h11.Connection, status: int, reason: str) -> bytes:
    """A 4xx (400; 431: headers too large) in OpenAI's shape, Connection: close, as h11 writes
    it."""
    body = json.dumps(APIError(status, f"malformed HTTP request: {reason}",
                               code="invalid_http").body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body))),
               (b"connection", b"close")]
    response = h11.Response(status_code=status, headers=headers,
                            reason=HTTPStatus(status).phrase.encode())
    return b"".join(conn.send(event) or b""
                    for event in (response, h11.Data(data=body), h11.EndOfMessage()))


def protocol_class(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """The protocol for uvicorn.Config(http=...), with these limits."""
    # The connections with no request in flight, longest idle first (a dict keeps its order).
    idle: dict[EmberProtocol, None] = {}

    class EmberProtocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The same connection, with the size limit uvicorn gave it.
            self.conn = _Connection(h11.SERVER, self.conn._max_incomplete_event_size)

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
                longest_idle = next(iter(idle), None)
                if longest_idle is not None:
                    idle.pop(longest_idle)
                    longest_idle.transport.close()
                else:  # every connection has a request in flight
                    self.app: Any = _over_limit  # this connection's requests get the 503
                    timeout = min(header_timeout, OVER_LIMIT_HEADER_TIMEOUT)
            self._track_idle()
            self._arm_header_timer(timeout)

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _track_idle(self) -> None:
            idle.pop(self, None)
            if not self._in_request() and not self.transport.is_closing():
                idle[self] = None  # idle from now: the newest

        def handle_events(self) -> None:
            super().handle_events()
            if self._in_request() == (self in idle):  # a request began (or ended) meanwhile
                self._track_idle()

        def send_400_response(self, msg: str) -> None:
            error = self.conn.protocol_error  # type: ignore[attr-defined]
            reason = str(error) if error is not None and str(error) else msg
            # h11's hint, but a client's mistake is never a 5xx (its 501 for an unknown
            # Transfer-Encoding is a 400 here).
            hint = error.error_status_hint if error is not None else 400
            status = hint if 400 <= hint < 500 else 400
            if status == 431:  # h11 says "Receive buffer too long"
                reason = (f"the request line and headers are larger than "
                          f"{self.conn._max_incomplete_event_size} bytes")
            if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.write(_bad_request_bytes(self.conn, status, reason[:200]))
            else:  # answered already; the rest of the request body is malformed
                log.info("closed a connection whose request body was malformed after its "
                         "response: %s", reason[:200])
            self.transport.close()

        def _arm_header_timer(self, timeout: float) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout, self._on_header_timeout)

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()  # no request (or only part of its headers) arrived

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track_idle()
            if not self.transport.is_closing():
                self._arm_header_timer(header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            idle.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return EmberProtocol
