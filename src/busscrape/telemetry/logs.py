"""Structured logs: events with fields, JSON lines in production, pretty on a terminal.

``log.info("task.acked", task_id=…, attempt=…)`` everywhere; never formatted sentences.
A redaction processor runs last-but-one so that secrets cannot reach any output: values of
sensitive keys are masked and credentials inside URLs (``nats://user:pass@host``) are cut.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from busscrape.printable import visible

SENSITIVE_KEYS = re.compile(r"(pass(word)?|secret|token|key|credential|authorization|cookie|seed)", re.I)
# The user-info of a URL: a user (maybe empty), then maybe ``:password`` (which may hold ``/``),
# up to the last ``@`` before white space. Over-matching a path with an ``@`` only masks more.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<auth>[^/@\s:]*(:\S*)?@)", re.I)
_INLINE_SECRETS = re.compile(
    r"(?P<k>(password|passwd|pwd|secret|token|access_key|secret_key|api_key|auth_token)[\"']?\s*[=:]\s*[\"']?)"
    r"(?P<v>[^\s\"'&,;}]+)",
    re.I,
)
MASK = "***"


def redact_text(text: str) -> str:
    """Cut credentials out of free text: URL user-info and ``password=…`` style pairs."""
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + MASK + "@", text)
    return _INLINE_SECRETS.sub(lambda m: m.group("k") + MASK, text)


def _redact_value(key: str, value: Any) -> Any:
    if isinstance(value, str):
        if SENSITIVE_KEYS.search(key) and key not in _SAFE_KEYS:
            return MASK
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(key, v) for v in value]
    secret_key = SENSITIVE_KEYS.search(key) and key not in _SAFE_KEYS
    if secret_key and value is not None and not isinstance(value, bool | int | float):
        return MASK
    return value


# Keys that match the pattern but hold no secret.
_SAFE_KEYS = {"task_key", "key", "object_key", "keys", "archive_key"}


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: mask secrets in every field, the event name included."""
    return {k: _redact_value(k, v) for k, v in event.items()}


def printable(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor for the console format: escape sequences in the two fields the
    console renderer prints as they are, the event and a traceback (which quotes messages a
    page wrote), are shown, not obeyed. The others it prints with ``repr``; JSON escapes all."""
    return {k: visible(v) if k in ("event", "exception") and isinstance(v, str) else v for k, v in event.items()}


def configure(fmt: str = "auto", level: str = "info", stream: Any = None) -> None:
    """Set up structlog (and route stdlib logging through it). Call once, from the CLI."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=getattr(stream, "isatty", lambda: False)())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        # Tracebacks become text before `redact`, in both formats: a secret in an exception's
        # message or a local must not reach a terminal either.
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        redact,
    ]
    last = [renderer] if fmt == "json" else [printable, renderer]
    structlog.configure(
        processors=[*shared, *last],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (nats, aiohttp, asyncio) log through stdlib logging: send it the same way.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(processors=[
        structlog.stdlib.ProcessorFormatter.remove_processors_meta, redact, *last,
    ], foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True)]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(getattr(logging, level.upper()), logging.INFO))
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # its errors reach us through callbacks
