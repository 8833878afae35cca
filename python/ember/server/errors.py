"""Errors as OpenAI clients expect them: {"error": {"message", "type", "param", "code"}}.

Status codes: 400 for every client mistake (malformed JSON, wrong types, a prompt longer than
the context (context_exceeded: llama-server's exceed_context_size_error type with n_prompt_tokens
and n_ctx, beside OpenAI's code), unsupported options), 401 for a missing or wrong API key,
403 for a Host header the server does not answer to (DNS rebinding), 404 for unknown routes,
405 for a wrong method, 408 for a body that does not arrive in time, 413 for a body over the
limit, 415 for a body not sent as application/json, 503 (with Retry-After) while the model
loads, when the queue is full, past --max-connections or while the server shuts down, 501 for
an endpoint whose capability ember lacks (embeddings, reranking), 500 only for bugs (logged
server-side with the traceback; the client gets a generic message and never the traceback).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ember.engine import EngineBusy, PromptTooLong
from ember.grammar import ConstraintError

log = logging.getLogger("ember.server")

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
                 code: str | None = None, error_type: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPES.get(status, "invalid_request_error")
        self.extra = extra or {}  # more fields of the error object (context_exceeded's)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type,
                          "param": self.param, "code": self.code, **self.extra}}

    def response(self, body: ErrorBody | None = None) -> Response:
        """The error as a JSON response: OpenAI's shape, or `body`'s (Anthropic's)."""
        return json_response(body(self) if body is not None else self.body(), self.status,
                             self.headers())

    def headers(self) -> dict[str, str] | None:
        if self.status == 401:
            return {"www-authenticate": "Bearer"}
        if self.status == 503:  # loading, queue full, too many connections, shutting down
            return {"retry-after": str(RETRY_AFTER_SECONDS)}
        return None


RETRY_AFTER_SECONDS = 1

ErrorBody = Callable[[APIError], Any]  # an API's error shape (OpenAI's is APIError.body)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def context_exceeded(message: str, param: str | None, n_prompt_tokens: int,
                     n_ctx: int) -> APIError:
    """A prompt over the context, answered in both shapes clients look for: llama-server's type
    exceed_context_size_error with n_prompt_tokens and n_ctx (its web UI and clients read them),
    and OpenAI's code context_length_exceeded."""
    return APIError(400, message, param=param, code="context_length_exceeded",
                    error_type="exceed_context_size_error",
                    extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})


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


def from_engine(err: Exception, *, max_queue: int) -> APIError | None:
    """The answer to an error the engine raised when a request was submitted: 503 for a full
    queue, 400 for a request that can never run (a ValueError, subclasses included: a
    constraint that cannot be compiled names its field); None for anything else (a bug)."""
    if isinstance(err, EngineBusy):
        return APIError(503, f"the server is busy: the queue holds {max_queue} waiting requests "
                        "(--max-queue); retry later", code="queue_full")
    if isinstance(err, ConstraintError):
        return bad_request(str(err), param=err.param, code="invalid_value")
    if isinstance(err, PromptTooLong):
        return context_exceeded(str(err), getattr(err, "param", None), err.n_prompt_tokens,
                                err.n_ctx)
    if isinstance(err, ValueError):
        return bad_request(str(err), param=getattr(err, "param", None), code="invalid_value")
    return None


Handler = Callable[[Request, Any], Awaitable[Response]]  # (request, AppContext) -> response


def endpoint(handler: Handler, error_body: ErrorBody | None = None
             ) -> Callable[[Request], Awaitable[Response]]:
    """A route's endpoint: handler(request, the AppContext), every error it raises answered
    in the route's error shape (a bug as a 500 without details, logged with its traceback)."""
    async def run(request: Request) -> Response:
        try:
            return await handler(request, request.app.state.ctx)
        except APIError as err:
            return err.response(error_body)
        except ClientDisconnect:
            log.info("%s %s: the client disconnected before its request body was complete",
                     request.method, request.url.path)
            return Response(status_code=499)  # nobody reads it
        except Exception:
            log.exception("bug while handling %s %s", request.method, request.url.path)
            return internal_error().response(error_body)

    return run


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no route, wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
        return APIError(404, message, code="not_found").response()
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return APIError(405, message, code="method_not_allowed").response()
    return APIError(exc.status_code, str(exc.detail)).response()


async def bug(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware logs the traceback; the client gets no details.
    return internal_error().response()
