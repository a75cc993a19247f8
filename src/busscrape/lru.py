"""A bounded cache: what a long-running daemon remembers per crawl, per origin or per host.

A worker lives through many crawls and meets hosts without end; anything it keeps per key must
have a bound, or memory grows for as long as it runs. ``Lru`` keeps the ``size`` most recently
used entries and forgets the oldest first; every such cache is a cache of something durable
(CRAWLS, COOLING, a setting), so a forgotten entry is read again, never lost.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an Lru holds at least one entry, not {size}")
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
