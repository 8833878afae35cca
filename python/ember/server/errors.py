"""Errors as OpenAI clients expect them: {"error": {"message", "type", "param", "code"}}.

Status codes: 400 for every client mistake (malformed JSON, wrong types, a prompt longer than
the context, unsupported options), 401 for a missing or wrong API key,
403 for a Host header the server does not answer to (DNS rebinding), 404 for unknown routes,
405 for a wrong method, 408 for a body that does not arrive in time, 413 for a body over the
limit, 415 for a body not sent as application/json, 503 (with Retry-After) while the model
loads, when the queue is full, past --max-connections or while the server shuts down, 501 for
an endpoint whose capability ember lacks (embeddings, reranking), 500 only for bugs (logged
server-side with the traceback; the client gets a generic message and never the traceback).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    403: "permission_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error answered to the client in OpenAI's shape; `message` must say what was wrong
    and, where it helps, what was expected."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type,
                          "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return json_response(self.body(), self.status, self.headers())

    def headers(self) -> dict[str, str] | None:
        if self.status == 401:
            return {"www-authenticate": "Bearer"}
        if self.status == 503:  # loading, queue full, too many connections, shutting down
            return {"retry-after": str(RETRY_AFTER_SECONDS)}
        return None


RETRY_AFTER_SECONDS = 1


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def internal_error() -> APIError:
    return APIError(500, "internal server error (a bug; the server log has the details)",
                    code="internal_error")


def dumps(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (echoed client text): JSON can escape it
        return json.dumps(value, separators=(",", ":")).encode()


def json_response(value: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(value), status_code=status, headers=headers,
                    media_type="application/json")
