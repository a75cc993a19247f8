"""What every answer of ``busscrape api`` is made of, and who may ask.

Every error is JSON, ``{"error": {"reason": …, "message": …}}``, whatever raised it (a bad body,
an unknown path, a wrong method, an oversize body): ``ApiError`` in a handler, ``errors`` as the
outermost middleware. With a token configured, ``Bearer`` checks ``Authorization: Bearer <token>``
on every request but ``/healthz`` and ``/openapi.json``, compared in constant time. The web
console's paths (``owns``) answer their failures with pages and check their own sessions.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import structlog
from aiohttp import web
from pydantic import BaseModel

from busscrape.api.schema import ErrorBody, ErrorDetail
from busscrape.bus.retry import TRANSIENT
from busscrape.errors import BusscrapeError

log = structlog.get_logger("busscrape.api")

OPEN = frozenset({"/healthz", "/openapi.json"})  # served without a token
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def owns(path: str) -> bool:
    """Whether a path is the web console's (``busscrape.api.console``: its own auth and error pages)."""
    return path == "/" or path.startswith("/console/")


class ApiError(Exception):
    """An answer other than success: status, reason code, message (and per-task outcomes)."""

    def __init__(self, status: int, reason: str, message: str, *, tasks: list[Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.tasks, self.headers = status, reason, message, tasks, headers


def reply(model: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(model.model_dump(mode="json")), status=status,
                        content_type="application/json", headers=headers)


def failure(status: int, reason: str, message: str, **extra: Any) -> web.Response:
    body = ErrorBody(error=ErrorDetail(reason=reason, message=message), tasks=extra.get("tasks"))
    # `tasks` only where there are some (POST /tasks), not as null in every other error.
    return web.Response(body=orjson.dumps(body.model_dump(mode="json", exclude_none=True)), status=status,
                        content_type="application/json", headers=extra.get("headers"))


@contextmanager
def unavailable_as_503(what: str) -> Iterator[None]:
    """A read of ``what`` on the bus that could not be answered is the server's 503, not a 500."""
    try:
        yield
    except BusscrapeError as exc:
        raise ApiError(503, exc.reason, exc.message) from None
    except TRANSIENT as exc:
        raise ApiError(503, "bus_unavailable", f"cannot read {what}: {exc!r}") from None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a JSON error, keeping what HTTP needs (``Allow`` on 405)."""
    if owns(request.path):  # the console answers its own failures with pages
        return await handler(request)
    try:
        return await handler(request)
    except ApiError as exc:
        return failure(exc.status, exc.reason, exc.message, tasks=exc.tasks, headers=exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status, "http_error")
        keep = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return failure(exc.status, reason, exc.text or exc.reason, headers=keep)
    except Exception as exc:  # a bug: say so, keep serving
        log.exception("api.failed", path=request.path)
        return failure(500, "internal_error", f"{type(exc).__name__}: the server failed; see its log")


class Bearer:
    """The bearer-token check, as a middleware (``token`` None: everything is let through)."""

    def __init__(self, token: bytes | None) -> None:
        self.token = token

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token is None or request.path in OPEN or owns(request.path):  # the console checks its own
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        given = given.lstrip(" ")  # RFC 6750: "Bearer" 1*SP token; nothing else is trimmed
        if scheme.lower() != "bearer" or not given:
            raise ApiError(401, "unauthorized", "this API wants `Authorization: Bearer <token>`",
                           headers={"WWW-Authenticate": 'Bearer realm="busscrape"'})
        # aiohttp keeps bytes that are not UTF-8 as surrogates: compare the bytes as received.
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token):
            raise ApiError(401, "invalid_token", "the bearer token is not the API's",
                           headers={"WWW-Authenticate": 'Bearer realm="busscrape", error="invalid_token"'})
        return await handler(request)
