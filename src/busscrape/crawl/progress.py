"""Following a crawl to its end, and its summary.

A crawl is done when every task it queued is archived or dead-lettered (the STATUS tracker,
``status.tracker``) *and* every archived page's links have been followed (its page record is in
CRAWLS): a page archived a moment before its links are queued does not end the crawl early.
The set of tasks to wait for grows as page records arrive; it is read from CRAWLS, never kept
in one process, so a second ``busscrape crawl`` (or ``GET /crawls/{id}``) sees the same.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from busscrape.bus.kv_watch import KvWatch
from busscrape.crawl.frontier import OUTCOMES
from busscrape.crawl.state import SEEDS, CrawlState
from busscrape.errors import EXIT_CONFIG, EXIT_PARTIAL
from busscrape.status.tracker import Tracker


@dataclass
class CrawlSummary:
    """What a crawl did: every discovered link in exactly one outcome, in total and per depth."""

    crawl_id: str
    links: dict[str, int]
    """``discovered``, ``queued``, ``duplicate``, ``out_of_scope``, ``robots_disallowed``,
    ``budget_cut`` … over the whole crawl (seeds included, as depth 0)."""
    by_depth: dict[int, dict[str, int]]
    pages_followed: int
    """Pages whose links were read (a page record each)."""
    not_followed: dict[str, int] = field(default_factory=dict)
    """Pages whose links were not followed, by why (``depth``, ``not_html``, ``redirected_out_of_scope``)."""
    archived: int = 0
    dead: int = 0
    done_by_depth: dict[int, dict[str, int]] = field(default_factory=dict)
    """Queued pages ``archived`` and ``dead``, by the depth they were queued at."""
    budget_used: int = 0
    """Pages queued (with ``max_pages``: slots of the budget taken)."""
    max_pages: int | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    """A sample of the skipped links with their reason."""
    seeds_redirected: dict[str, str] = field(default_factory=dict)
    """Seed → where it redirected, which the scope took in (``crawl.scope``)."""
    seeds_skipped: list[dict[str, str]] = field(default_factory=list)
    """The seeds (and sitemap URLs) not queued, with their reason (``blocked``, ``robots_disallowed`` …)."""
    seeds_queued: int = 0
    seeding: bool = False
    """The crawl's rules are stored, its seeds not queued yet (its sitemaps are being read)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def link_depth(record: dict[str, Any]) -> int:
    """The depth of the links a page record lists (the seeds' record: 0; a page's: its depth + 1)."""
    return int(record.get("link_depth", record.get("depth", 0) + 1))


def summarise(crawl_id: str, pages: dict[str, dict[str, Any]]) -> CrawlSummary:
    total: Counter[str] = Counter({k: 0 for k in OUTCOMES})
    depths: dict[int, Counter[str]] = {}
    not_followed: Counter[str] = Counter()
    skipped: list[dict[str, str]] = []
    redirected: dict[str, str] = {}
    seeds = pages.get(SEEDS) or {}
    for record in pages.values():
        if "part" in record:
            continue  # the overflow of a record's queued ids (``CrawlState.record_page``), no page of its own
        if record.get("seed_redirected_to"):
            redirected[record["url"]] = record["seed_redirected_to"]
        counts = record.get("counts") or {}
        total.update(counts)
        depths.setdefault(link_depth(record), Counter()).update(counts)
        if record.get("not_followed"):
            not_followed[record["not_followed"]] += 1
        skipped.extend(record.get("skipped") or ())
    return CrawlSummary(crawl_id=crawl_id, links=dict(total),
                        by_depth={d: {k: v for k, v in c.items() if v} for d, c in sorted(depths.items())},
                        pages_followed=sum(k != SEEDS and "part" not in r for k, r in pages.items()),
                        not_followed=dict(not_followed),
                        skipped=skipped[:50], seeds_redirected=redirected,
                        seeds_skipped=list(seeds.get("skipped") or ()), seeds_queued=len(seeds.get("queued") or ()))


SEED_SKIPS = {
    "blocked": "the network policy refuses its address; open it with --allow ADDRESS (BUSSCRAPE_NETWORK__ALLOW) "
               "where the crawl is started and on the workers, then ask for the same crawl again",
    "robots_disallowed": "robots.txt disallows it (--robots ignore crawls it anyway)",
    "budget_cut": "--max-pages left no room for it",
    "invalid": "it is not a URL busscrape can crawl",
}
"""Why a seed was not queued, as a user reads it (the record says the reason code)."""


def unseeded(queued: int, skipped: list[dict[str, str]]) -> tuple[int, str] | None:
    """A crawl none of whose seeds was queued has nothing to crawl: the exit code (2 when the
    network policy refused one, a configuration to fix; else 1) and what to say, one seed a
    line. None when a seed was queued."""
    if queued:
        return None
    lines = [f"  {s['url']}: {s['reason']} ({SEED_SKIPS.get(s['reason'], 'skipped')})" for s in skipped]
    code = EXIT_CONFIG if any(s["reason"] == "blocked" for s in skipped) else EXIT_PARTIAL
    return code, "nothing to crawl: no seed was queued\n" + "\n".join(lines)


async def count_budget(state: CrawlState, summary: CrawlSummary) -> None:
    """Fill in the pages the crawl queued: its budget key's count with ``--max-pages`` (and that
    budget); without, every page record's queued (such a crawl's links skip the budget key:
    ``crawl.frontier``)."""
    summary.max_pages = (await state.spec(summary.crawl_id)).max_pages
    if summary.max_pages is None:
        summary.budget_used = summary.links.get("queued", 0)
    else:
        summary.budget_used = await state.used(summary.crawl_id)


class CrawlWatch:
    """Feeds a ``Tracker`` with the tasks a crawl queues, from its page records as they come."""

    def __init__(self, state: CrawlState, tracker: Tracker, crawl_id: str) -> None:
        self.state = state
        self.tracker = tracker
        self.crawl_id = crawl_id
        self.followed: set[str] = set()
        self.tasks: set[str] = set()
        """The crawl's tasks (the tracker may follow other tasks too: ``run`` of a mixed input)."""
        self._watch = KvWatch(self._entry, name="crawl-watch")

    async def start(self) -> None:
        await self._watch.start(await self.state.kv(), f"{self.crawl_id}.page.>")

    async def stop(self) -> None:
        await self._watch.stop()

    def _entry(self, key: str, value: bytes) -> None:
        self.see(key.removeprefix(f"{self.crawl_id}.page."), orjson.loads(value))

    def see(self, page: str, record: dict[str, Any]) -> None:
        for task_id in record.get("queued") or ():
            self.tasks.add(task_id)
            if task_id not in self.tracker.expected:
                self.tracker.expect(task_id, None)
        self.followed.add(page)
        self.tracker.poke()  # a page record is progress too: the crawl may be done now

    @property
    def done(self) -> bool:
        final = self.tracker.final
        if SEEDS not in self.followed or not all(t in final for t in self.tasks):
            return False
        return all(t in self.followed for t in self.tasks if final[t].state == "archived")

    async def summary(self) -> CrawlSummary:
        summary = summarise(self.crawl_id, await self.state.pages(self.crawl_id))
        states = [self.tracker.final[t].state for t in self.tasks if t in self.tracker.final]
        summary.archived, summary.dead = states.count("archived"), states.count("dead")
        await count_budget(self.state, summary)
        return summary
