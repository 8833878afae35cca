"""What keeps a web page from driving the server through its visitor's browser, and the CORS
answers that let the pages it allows use it.

- DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and then calls the
  server as "same origin"; its requests still say `Host: evil.example`. HostCheckMiddleware
  answers 403 to every Host that is not an IP address, `localhost` (or a name under it), the
  address the server listens on, or a `--host-allow` name ("*" allows any).
- Cross-origin requests: CORSMiddleware answers 403 to a request whose Origin header is
  neither this server's own origin (the bundled chat page), a loopback origin (another port of
  localhost, 127.0.0.1 or [::1]: pages the user runs on this machine) nor one of
  `--cors-origins`, so no other site's page can make a visitor's browser use the server — not
  even with a "simple" request that needs no preflight. llama-server answers every origin;
  ember's default is narrower on purpose (a local model server is reachable by every page its
  user opens), and `--cors-origins '*'` gives llama-server's behaviour.
  `--cors-origins` takes llama-server's values: `*` (any origin), `localhost` (loopback origins
  on any port: the default already), or a comma-separated list of origins
  (`https://app.example,http://10.0.0.5:3000`).
- Allowed origins get the same CORS answer on every route, known or not: a preflight (OPTIONS
  with Origin) is answered 200 by this middleware itself, before the API key check (browsers
  send no Authorization header on a preflight), with Access-Control-Allow-Origin (the origin),
  -Credentials true, -Methods GET, POST, OPTIONS, -Headers (those asked for) and -Max-Age;
  every other response to them (errors included) carries Access-Control-Allow-Origin,
  -Credentials and Vary: Origin.
- Simple cross-site requests that slip past (no Origin header): AppContext.read_json refuses
  every body not sent as application/json (415), so they cannot start a generation.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
# What an origin in --cors-origins must look like: scheme://host[:port], no path.
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")
PREFLIGHT_MAX_AGE = 600  # seconds a browser may reuse a preflight's answer


def cors_origins(values: list[str]) -> list[str]:
    """--cors-origins' values checked and normalized (lower case, no trailing slash): "*",
    "localhost" (loopback origins, allowed anyway) or origins; ValueError naming a value that
    is none of them (a bare host name would never match a browser's Origin header)."""
    origins = []
    for value in values:
        origin = value.strip().rstrip("/").lower()
        if origin not in ("*", "localhost") and not _ORIGIN.fullmatch(origin):
            raise ValueError(f"cors_origins: '{value}' is not an origin (scheme://host[:port], "
                             "e.g. https://app.example), '*' or 'localhost'")
        origins.append(origin)
    return origins


def _header(scope: Scope, key: bytes) -> str | None:
    raw = next((v for k, v in scope["headers"] if k == key), None)
    return raw.decode("latin-1") if raw is not None else None


class CORSMiddleware:
    """403 for a browser request from an origin that is not allowed, CORS headers for one that
    is (see the top of this file); requests without an Origin header (curl, SDKs) pass."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        origins = cors_origins(allowed)
        self._any = "*" in origins
        self._origins = set(origins) - {"*", "localhost"}
        self._loopback = re.compile(LOOPBACK_ORIGIN)

    def allows(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if self._any or origin in self._origins or self._loopback.fullmatch(origin):
            return True
        # Same origin: the page this server served (its Host, whatever name it goes by).
        _, _, authority = origin.partition("://")
        return host is not None and authority == host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not self.allows(origin, _header(scope, b"host")):
            error = APIError(403, f"requests from the web origin '{origin[:100]}' are not "
                             "allowed (a page on another site must not use this server "
                             "through its visitor's browser); start the server with "
                             "--cors-origins ORIGIN to allow it", code="origin_not_allowed")
            await error.response()(scope, receive, send)
            return
        allow = {"access-control-allow-origin": origin,
                 "access-control-allow-credentials": "true", "vary": "Origin"}
        if scope["method"] == "OPTIONS":
            asked = _header(scope, b"access-control-request-headers")
            preflight = {**allow, "access-control-allow-methods": "GET, POST, OPTIONS",
                         "access-control-max-age": str(PREFLIGHT_MAX_AGE)}
            if asked:
                preflight["access-control-allow-headers"] = asked
            await Response(status_code=200, headers=preflight)(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for key, value in allow.items():
                    if key == "vary" and "vary" in headers:
                        headers.add_vary_header(value)
                    else:
                        headers[key] = value
            await send(message)

        await self.app(scope, receive, send_with_cors)
