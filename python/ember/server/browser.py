"""What keeps a web page from driving the server through its visitor's browser.

- DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and then calls the
  server as "same origin"; its requests still say `Host: evil.example`. HostCheckMiddleware
  answers 403 to every Host that is not an IP address, `localhost` (or a name under it), the
  address the server listens on, or a `--host-allow` name ("*" allows any).
- Simple cross-site requests (a form or fetch POST with text/plain, sent without a CORS
  preflight): AppContext.read_json refuses every body not sent as application/json (415), so
  they cannot start a generation; application/json from another origin needs a preflight,
  which only `--cors-origins` answers.
"""

from __future__ import annotations

import ipaddress

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
