"""Per-host politeness limits: the fleet-wide defaults, overrides by glob, and raised minimum delays.

A politeness file (``worker.host_rules``) is TOML, ``[[host]]`` tables tried in order, the first
whose ``glob`` matches the host (``fnmatch``, case-insensitive) wins; a field it leaves out keeps
the default::

    [[host]]
    glob = "*.example.com"
    concurrency = 1
    delay = "2s"
    jitter = "500ms"

``raise_delay(host, seconds)`` is the seam for robots ``Crawl-delay`` (the crawl feature): a host's
delay becomes at least that, never less than its rule says.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from busscrape.errors import ConfigurationError
from busscrape.units import parse_duration

_MAX_RAISED = 100_000  # raised delays remembered (a crawl over many hosts must not grow this without bound)


@dataclass(frozen=True)
class Limit:
    concurrency: int
    delay: float
    jitter: float = 0.0


@dataclass(frozen=True)
class Rule:
    glob: str
    concurrency: int | None = None
    delay: float | None = None
    jitter: float | None = None

    def apply(self, limit: Limit) -> Limit:
        return Limit(self.concurrency if self.concurrency is not None else limit.concurrency,
                     self.delay if self.delay is not None else limit.delay,
                     self.jitter if self.jitter is not None else limit.jitter)


class HostRules:
    def __init__(self, default: Limit, rules: tuple[Rule, ...] = ()) -> None:
        self.default = default
        self.rules = rules
        self._raised: dict[str, float] = {}

    @classmethod
    def load(cls, default: Limit, path: Path | None) -> HostRules:
        return cls(default, read_rules(path) if path is not None else ())

    def limit(self, host: str) -> Limit:
        host = host.lower()
        limit = next((r.apply(self.default) for r in self.rules if fnmatch.fnmatchcase(host, r.glob)), self.default)
        raised = self._raised.get(host, 0.0)
        return replace(limit, delay=raised) if raised > limit.delay else limit

    def raise_delay(self, host: str, seconds: float) -> None:
        """Make ``host``'s delay at least ``seconds`` (robots Crawl-delay); it never lowers one."""
        host = host.lower()
        if seconds > self._raised.get(host, 0.0):
            if len(self._raised) >= _MAX_RAISED:
                self._raised.pop(next(iter(self._raised)))
            self._raised[host] = seconds


def read_rules(path: Path) -> tuple[Rule, ...]:
    """The ``[[host]]`` rules of a politeness file; a bad one is an error naming file, rule and field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot read the politeness file: {exc}") from None
    unknown = set(data) - {"host"}
    if unknown:
        raise ConfigurationError(f"{path}: unknown table(s) {', '.join(sorted(unknown))} (only [[host]])")
    return tuple(_rule(path, i, raw) for i, raw in enumerate(data.get("host", []), 1))


def _rule(path: Path, number: int, raw: Any) -> Rule:
    where = f"{path}: [[host]] #{number}"
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where}: not a table")
    unknown = set(raw) - {"glob", "concurrency", "delay", "jitter"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    glob = raw.get("glob")
    if not isinstance(glob, str) or not glob:
        raise ConfigurationError(f"{where}: 'glob' must be a non-empty string")
    concurrency = raw.get("concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise ConfigurationError(f"{where} ({glob}): 'concurrency' must be a whole number ≥ 1, not {concurrency!r}")
    return Rule(glob.lower(), concurrency, _seconds(where, glob, "delay", raw), _seconds(where, glob, "jitter", raw))


def _seconds(where: str, glob: str, name: str, raw: dict[str, Any]) -> float | None:
    if name not in raw:
        return None
    try:
        value = parse_duration(raw[name])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where} ({glob}): '{name}': {exc}") from None
    if value < 0:
        raise ConfigurationError(f"{where} ({glob}): '{name}' must not be negative")
    return value
