"""GET /: the bundled chat page (webui/index.html: one dependency-free file, package data), a
place to chat for a user who opens the server in a browser. It calls /v1/chat/completions
from the same origin, streaming; `--no-webui` leaves the route out.

The page itself holds nothing secret, so it is served without the API key (the page asks for
one when the API answers 401). Its Content-Security-Policy lets it talk to this server only and
keeps it out of other sites' frames.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from ember.server.context import AppContext

PAGE = Path(__file__).parent / "webui" / "index.html"
_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}


@lru_cache(maxsize=1)
def _page() -> bytes:
    return PAGE.read_bytes()


async def index(request: Request, ctx: AppContext) -> Response:
    return Response(_page(), media_type="text/html; charset=utf-8", headers=_HEADERS)
