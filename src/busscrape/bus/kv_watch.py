"""A KV watch fed, entry by entry, to a callback in a task of its own until stopped: how
``busscrape run``'s tracker follows STATUS and a crawl's watch follows its page records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from nats.js.kv import KeyValue

from busscrape import cancelling

STOP_GRACE = 10.0  # seconds a stopped watch has to end its iteration


class KvWatch:
    def __init__(self, on_entry: Callable[[str, bytes], None], *, name: str) -> None:
        self._on_entry = on_entry
        self._name = name
        self._watcher: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, kv: KeyValue, keys: str | None = None) -> None:
        """Watch ``keys`` (a subject filter) of ``kv``, or all of it."""
        self._watcher = await (kv.watch(keys) if keys is not None else kv.watchall())
        self._task = asyncio.create_task(self._follow(), name=self._name)

    async def stop(self) -> None:
        # The watcher's own stop ends the iteration; the cancel is for a callback in progress.
        # Not a cancel alone: a cancel that meets an entry arriving is lost inside
        # ``asyncio.wait_for`` (Python 3.11), and a loop around it waited again for ever — a
        # `busscrape crawl` interrupted with Ctrl-C that never ended.
        if self._watcher is not None:
            with contextlib.suppress(Exception):  # the connection may be gone already
                await self._watcher.stop()
        if self._task is not None:
            # Bounded as well: should the watcher's stop not reach the server (the connection
            # gone) and the cancel be lost too, the watch is left behind, the caller goes on.
            await cancelling.stop(self._task, grace=STOP_GRACE, what=self._name)

    async def _follow(self) -> None:
        async for entry in self._watcher:
            # None marks the end of the initial values; an empty value is a delete or purge.
            if entry is not None and entry.value:
                self._on_entry(entry.key, entry.value)
