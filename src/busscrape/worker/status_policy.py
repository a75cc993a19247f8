"""Which HTTP statuses are retried, which dead-letter at once, and which are archived.

Written as lists of codes and ranges (``"408,425,429,500-599"``). A status in both lists is
retried (then dead-lettered when retries run out); one in neither is a normal result — a 2xx,
a 3xx the browser did not follow, or a 4xx the policy chose to keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from busscrape.errors import ConfigurationError


def parse_statuses(spec: str, setting: str = "statuses") -> frozenset[int]:
    codes: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        try:
            low, _, high = part.partition("-")
            first, last = int(low), int(high or low)
        except ValueError:
            raise ConfigurationError(f"{setting}: {part!r} is not a status or a range like 500-599") from None
        if not 100 <= first <= last <= 599:
            raise ConfigurationError(f"{setting}: {part!r} is outside 100-599")
        codes.update(range(first, last + 1))
    return frozenset(codes)


@dataclass(frozen=True)
class StatusPolicy:
    retry: frozenset[int]
    dead: frozenset[int]

    @classmethod
    def parse(cls, retry: str, dead: str) -> StatusPolicy:
        return cls(parse_statuses(retry, "BUSSCRAPE_WORKER__RETRY_STATUSES"),
                   parse_statuses(dead, "BUSSCRAPE_WORKER__DEAD_STATUSES"))

    def verdict(self, status: int | None) -> Literal["retry", "dead"] | None:
        if status is None:
            return None
        if status in self.retry:
            return "retry"
        if status in self.dead:
            return "dead"
        return None
