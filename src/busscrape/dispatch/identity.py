"""The task id ``busscrape dispatch`` gives an input line, computed without dispatching.

One derivation (the dispatcher's line parser, URL normaliser and ``task_key``) for everyone who
must know an id beforehand: the API's intake matches outcomes back to the request,
``busscrape task URL`` and ``GET /tasks?url=`` look a page up by its URL.
"""

from __future__ import annotations

from typing import Any

import orjson

from busscrape.dispatch.inputs import LineParser, Rejection, TaskDefaults
from busscrape.dispatch.urls import UrlNormaliser, UrlRules
from busscrape.errors import InputError
from busscrape.model.messages import task_key
from busscrape.settings import Settings


class TaskIdentity:
    """Task ids of JSONL task specs, under one set of settings and defaults."""

    def __init__(self, settings: Settings, defaults: TaskDefaults | None = None) -> None:
        self._parse = LineParser("jsonl", defaults or TaskDefaults())
        self._normalise = UrlNormaliser(UrlRules.from_settings(settings.dispatch))

    def of_line(self, number: int, line: str) -> str:
        """The id of a JSONL line; ``InputError`` with the dispatcher's reason when it would be
        rejected."""
        spec = self._parse(number, line)
        if isinstance(spec, Rejection):
            raise InputError(spec.detail, reason=spec.reason)
        if spec is None:
            raise InputError("blank line", reason="invalid_task")
        return task_key(self._normalise(spec.url), spec.steps, spec.options)

    def of_url(self, url: str, spec: dict[str, Any] | None = None) -> str:
        """The id of ``url`` with the steps and options of ``spec`` (a JSONL task spec without its
        url; none: the defaults)."""
        return self.of_line(1, orjson.dumps({**(spec or {}), "url": url}).decode())


def task_id_for_url(url: str, settings: Settings, spec: dict[str, Any] | None = None) -> str:
    """``TaskIdentity(settings).of_url(url, spec)``."""
    return TaskIdentity(settings).of_url(url, spec)
