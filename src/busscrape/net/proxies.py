"""Which upstream proxy a task goes through: pools, routes by host glob, rotation, health.

A task's ``options.proxy`` decides first: ``direct`` (none), the name of a pool, or a proxy URL
without credentials (credentials live in settings only, never in a task). Otherwise the first
``proxy.routes`` glob that matches the host names the pool, else ``proxy.default_pool``, else the
task goes direct. Within a pool, ``proxy.rotation`` picks: ``round_robin``, ``random``,
``sticky_host`` (a host keeps its proxy while that proxy is healthy) or ``sticky_session`` (a
session keeps its proxy; a session-less task goes round robin). A proxy that fails
``bench_after`` times in a row (reported by the egress proxy: unreachable, or refusing the
tunnel) is benched for ``bench_for``, then tried again; a pool whose proxies are all benched
uses the one benched longest ago rather than none.
"""

from __future__ import annotations

import fnmatch
import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from busscrape.errors import ConfigurationError, InvalidTask
from busscrape.net.upstream import Upstream
from busscrape.settings import ProxySettings

log = structlog.get_logger("busscrape.proxies")

DIRECT = "direct"
_MAX_STICKY = 100_000


@dataclass
class _Health:
    failures: int = 0
    benched_until: float = 0.0


class Proxies:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.pools: dict[str, tuple[Upstream, ...]] = {}
        for name, urls in settings.pools.items():
            self.pools[name] = tuple(Upstream.parse(u, f"BUSSCRAPE_PROXY__POOLS[{name}]") for u in urls)
        for name, path in settings.pool_files.items():
            self.pools[name] = read_pool_file(name, path)
        for glob, pool in settings.routes.items():
            if pool not in self.pools and pool != DIRECT:
                raise ConfigurationError(f"BUSSCRAPE_PROXY__ROUTES: {glob!r} names no pool {pool!r} "
                                         f"(pools: {', '.join(sorted(self.pools)) or 'none'})")
        if settings.default_pool is not None and settings.default_pool not in self.pools:
            raise ConfigurationError(f"BUSSCRAPE_PROXY__DEFAULT_POOL: no pool {settings.default_pool!r}")
        for name, members in self.pools.items():
            if not members:
                raise ConfigurationError(f"proxy pool {name!r} has no proxy")
        self._turns = {name: itertools.count() for name in self.pools}
        self._health: dict[Upstream, _Health] = {}
        self._sticky: dict[tuple[str, str], Upstream] = {}

    @property
    def configured(self) -> bool:
        return bool(self.pools)

    def choose(self, task_proxy: str | None, host: str, session: str | None = None,
               prefer: str | None = None) -> Upstream | None:
        """The proxy for one task (None: direct). A task naming an unknown pool is invalid.
        ``prefer``: the proxy (credential-free URL) a session used before, kept while it is in
        the pool and healthy, so a session sticks to one proxy across workers."""
        pool = task_proxy or self._route(host.lower())
        if pool is None or pool == DIRECT:
            return None
        if "://" in pool:
            return Upstream.parse(pool, "options.proxy")
        members = self.pools.get(pool)
        if members is None:
            raise InvalidTask(f"options.proxy names no pool {pool!r} on this worker "
                              f"(pools: {', '.join(sorted(self.pools)) or 'none'})", reason="unknown_proxy")
        if prefer is not None:
            now = time.monotonic()
            for member in members:
                if member.url == prefer and self._health.get(member, _Health()).benched_until <= now:
                    return member
        return self._pick(pool, members, host.lower(), session)

    def _route(self, host: str) -> str | None:
        for glob, pool in self.settings.routes.items():
            if fnmatch.fnmatchcase(host, glob.lower()):
                return pool
        return self.settings.default_pool

    def _pick(self, pool: str, members: tuple[Upstream, ...], host: str, session: str | None) -> Upstream:
        now = time.monotonic()
        healthy = [m for m in members if self._health.get(m, _Health()).benched_until <= now]
        if not healthy:  # all benched: the one that comes back first
            return min(members, key=lambda m: self._health[m].benched_until)
        rotation = self.settings.rotation
        key = (pool, host) if rotation == "sticky_host" else (pool, session) if (
            rotation == "sticky_session" and session) else None
        if key is not None:
            kept = self._sticky.get(key)
            if kept is not None and kept in healthy:
                return kept
        if rotation == "random":
            chosen = random.choice(healthy)
        else:
            chosen = healthy[next(self._turns[pool]) % len(healthy)]
        if key is not None:
            if len(self._sticky) >= _MAX_STICKY:
                self._sticky.pop(next(iter(self._sticky)))
            self._sticky[key] = chosen
        return chosen

    def report(self, upstream: Upstream, ok: bool) -> None:
        """What the egress proxy saw of one attempt through ``upstream``."""
        health = self._health.setdefault(upstream, _Health())
        if ok:
            health.failures = 0
            return
        health.failures += 1
        if health.failures >= self.settings.bench_after:
            health.failures = 0
            health.benched_until = time.monotonic() + self.settings.bench_for
            log.warning("proxy.benched", proxy=upstream.url, seconds=self.settings.bench_for)

    def benched(self) -> list[str]:
        now = time.monotonic()
        return sorted(u.url for u, h in self._health.items() if h.benched_until > now)


def read_pool_file(name: str, path: Path) -> tuple[Upstream, ...]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigurationError(f"BUSSCRAPE_PROXY__POOL_FILES[{name}]: cannot read {path}: {exc}") from None
    return tuple(Upstream.parse(line, f"{path}:{number}") for number, raw in enumerate(lines, 1)
                 if (line := raw.split("#", 1)[0].strip()))
