"""What keeps a web page from driving the server through its visitor's browser.

- DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and then calls the
  server as "same origin"; its requests still say `Host: evil.example`. HostCheckMiddleware
  answers 403 to every Host that is not an IP address, `localhost` (or a name under it), the
  address the server listens on, or a `--host-allow` name ("*" allows any).
- Cross-origin requests: OriginCheckMiddleware answers 403 to a request whose Origin header is
  neither this server's own origin (the bundled chat page), a loopback origin (another port of
  localhost, 127.0.0.1 or [::1]: pages the user runs on this machine) nor one of
  `--cors-origins` ("*": any), so no other site's page can make a visitor's browser use the
  server — not even with a "simple" request that needs no preflight. Allowed origins get CORS
  headers (Starlette's CORSMiddleware: preflights answered with the methods and headers asked
  for, Authorization and x-api-key included).
- Simple cross-site requests that slip past (no Origin header): AppContext.read_json refuses
  every body not sent as application/json (415), so they cannot start a generation.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from ember.server.errors import APIError


def host_name(host_header: str) -> str:
    """The name of a Host header value, without the port: "[::1]:8080" -> "::1"."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheckMiddleware:
    """403 for a Host header that names neither this server nor an allowed name."""

    def __init__(self, app: ASGIApp, listen_host: str, allowed: list[str]) -> None:
        self.app = app
        self._any = "*" in allowed
        self._names = {n.lower().rstrip(".") for n in (*allowed, listen_host) if n and n != "*"}

    def allows(self, name: str) -> bool:
        name = name.rstrip(".")
        return (self._any or _is_ip(name) or name == "localhost" or name.endswith(".localhost")
                or name in self._names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = next((v for k, v in scope["headers"] if k == b"host"), None)
            # No Host header: HTTP/1.0, which browsers never send.
            name = host_name(raw.decode("latin-1")) if raw is not None else None
            if name is not None and not self.allows(name):
                error = APIError(403, f"the Host header names '{name[:100]}', which this server "
                                 "does not answer to (it protects against DNS rebinding); "
                                 "start it with --host-allow NAME to allow that name",
                                 code="invalid_host")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


# http(s)://localhost, 127.x.x.x or [::1], any port: loopback pages are the user's own.
LOOPBACK_ORIGIN = r"https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?"


def _header(scope: Scope, key: bytes) -> str | None:
    raw = next((v for k, v in scope["headers"] if k == key), None)
    return raw.decode("latin-1") if raw is not None else None


class OriginCheckMiddleware:
    """403 for a browser request from an origin that is not allowed (see the top of this
    file); requests without an Origin header (curl, SDKs) pass."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self._any = "*" in allowed
        self._origins = {o.rstrip("/").lower() for o in allowed}
        self._loopback = re.compile(LOOPBACK_ORIGIN)

    def allows(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if self._any or origin in self._origins or self._loopback.fullmatch(origin):
            return True
        # Same origin: the page this server served (its Host, whatever name it goes by).
        _, _, authority = origin.partition("://")
        return host is not None and authority == host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and not self.allows(origin, _header(scope, b"host")):
                error = APIError(403, f"requests from the web origin '{origin[:100]}' are not "
                                 "allowed (a page on another site must not use this server "
                                 "through its visitor's browser); start the server with "
                                 "--cors-origins ORIGIN to allow it", code="origin_not_allowed")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
