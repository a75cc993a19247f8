"""The frontier: discovered links in, new tasks in SEEN out, every link accounted for.

A page's links go through, in order: the dispatcher's normaliser (``dispatch.urls``: one
spelling per page, tracking parameters and fragments dropped per settings), the crawl's scope
and include/exclude (``scope``), the network policy, robots.txt (``robots``), then SEEN: a link
whose task is there already is a duplicate; the rest take slots of the crawl's budget
(``state.reserve``, compare-and-set) and are *created* in SEEN exactly as ``busscrape dispatch``
creates tasks (``Nats-Expected-Last-Subject-Sequence: 0``: first writer wins), which queues them
in TASKS. Two workers finding one link make one task; a slot reserved for a link another worker
created in between is given back (``state.settle``). The reservation is held under the page's
task id until then: a worker killed between reserving and creating leaves it for the page's
redelivery, which re-uses it (no slot lost, none taken twice).

A crawl without ``--max-pages`` has no budget to keep: its links are created at once, and only
those that were there already are looked up in SEEN (this page's own, from an earlier go, or
another page's): two round trips per page instead of six (bench/crawl.py measures the cost).

What the links became is written once per page (``<crawl>.page.<task_id>``), after its result:
a redelivery of the page finds that record and does nothing twice, or finds only the links kept
for it (``<crawl>.links.<task_id>``, written before the result) and finishes the job. A link
created by an earlier attempt of the same page is recognised by its ``parent`` and counted as
queued by this page, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import nats.js.errors
import structlog
from nats.js import JetStreamContext

from busscrape.bus import names
from busscrape.bus.publisher import WRONG_LAST_SEQUENCE
from busscrape.crawl.links import PageLinks
from busscrape.crawl.robots import Robots, origin_of
from busscrape.crawl.scope import ScopeRules
from busscrape.crawl.spec import CrawlSpec, crawl_task_id
from busscrape.crawl.state import MAX_CRAWLS, SEEDS, CrawlState
from busscrape.dispatch.urls import UrlNormaliser, UrlRules
from busscrape.errors import InputError, MessageDecodeError, PolicyBlocked, RetryableError
from busscrape.lru import Lru
from busscrape.model import bounds
from busscrape.model.messages import CrawlRef, ScrapeTask, decode, encode, identity_tail
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import Settings

if TYPE_CHECKING:
    # Annotations only: the daemons load the OpenTelemetry SDK, the short commands need not.
    from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.crawl")

OUTCOMES = ("discovered", "queued", "duplicate", "invalid", "out_of_scope", "excluded", "not_included", "blocked",
            "robots_disallowed", "budget_cut", "depth_cut", "follow_failed")
"""What a page record counts: every discovered link ends in exactly one of the others."""
MAX_SKIPPED = 50  # skipped links named in a page record (the counts hold them all)
IN_FLIGHT = 64  # SEEN requests at once per page
MAX_ORIGINS = 10_000  # policy verdicts remembered per process


class Frontier:
    def __init__(self, js: JetStreamContext, settings: Settings, policy: NetworkPolicy,
                 telemetry: Telemetry | None = None) -> None:
        self.js = js
        self.telemetry = telemetry
        self.state = CrawlState(js)
        self.policy = policy
        self.robots = Robots(self.state, policy)
        self._normalise = UrlNormaliser(UrlRules.from_settings(settings.dispatch))
        self._ttl = str(max(1, int(settings.dispatch.recrawl_after)))
        self._rules: Lru[str, ScopeRules] = Lru(MAX_CRAWLS)
        self._tails: Lru[str, bytes] = Lru(MAX_CRAWLS)
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._blocked: Lru[str, bool] = Lru(MAX_ORIGINS)
        """origin → whether the network policy refuses it (the worker's egress checks every request anyway)."""

    async def rules(self, spec: CrawlSpec, known: int = 0) -> ScopeRules:
        """The crawl's scope with where its seeds redirected (cached, and read again when a task
        was made knowing more of those than this process: ``CrawlRef.seeds_redirected``)."""
        rules = self._rules.get(spec.crawl_id)
        if rules is None or len(rules.redirected) < known:
            rules = self._rules[spec.crawl_id] = ScopeRules(spec, await self.state.redirected_seeds(spec.crawl_id))
        return rules

    async def _widen(self, spec: CrawlSpec, landed: str) -> ScopeRules:
        """A seed redirected out of the scope: where it landed is a seed of the scope from now on."""
        redirected = await self.state.add_redirected_seed(spec.crawl_id, landed)
        rules = self._rules[spec.crawl_id] = ScopeRules(spec, redirected)
        log.info("crawl.seed_redirected", crawl_id=spec.crawl_id, to=landed)
        return rules

    def task_id(self, spec: CrawlSpec, url: str) -> str:
        """``crawl_task_id`` of a link, the crawl's steps and options encoded once per crawl."""
        tail = self._tails.get(spec.crawl_id)
        if tail is None:
            tail = self._tails[spec.crawl_id] = identity_tail(spec.steps, spec.options)
        return crawl_task_id(spec.crawl_id, url, tail=tail)

    # -- seeds ------------------------------------------------------------------------------

    async def seed(self, spec: CrawlSpec, extra: Sequence[str] = (), *,
                   sitemaps: dict[str, Any] | None = None) -> dict[str, Any]:
        """Store the crawl and queue its seeds (and ``extra`` URLs, from sitemaps, whose reading
        ``sitemaps`` describes: ``SitemapSeeds.record``) at depth 0; a crawl seeded before
        keeps its seed record (it resumes)."""
        await self.state.start(spec)
        record = await self.state.page(spec.crawl_id, SEEDS)
        if record is None:
            record = {"url": None, "depth": -1, "parent": None,
                      **await self._enqueue(spec, None, 0, [*spec.seeds, *extra], scoped=bool(extra),
                                            seeds=set(spec.seeds))}
            if sitemaps is not None:
                record["sitemaps"] = sitemaps
            await self.state.record_page(spec.crawl_id, SEEDS, record)
            record = await self.state.page(spec.crawl_id, SEEDS) or record
        elif any(s.get("reason") == "blocked" for s in record.get("skipped") or ()):
            record = await self._recheck_blocked(spec)
        return record

    async def _recheck_blocked(self, spec: CrawlSpec) -> dict[str, Any]:
        """The crawl is asked for again: the seeds the network policy refused then are checked
        against this process's policy now (the same command with ``--allow`` resumes the crawl
        instead of finding it blocked for good). Those it lets through are queued and the seed
        record rewritten (compare-and-set: two processes re-checking at once queue each seed once,
        both recognising it by its seed parent in SEEN)."""
        while True:
            record, revision = await self.state.page_at(spec.crawl_id, SEEDS)
            assert record is not None and revision is not None
            blocked = [s["url"] for s in record.get("skipped") or () if s.get("reason") == "blocked"]
            if not blocked:
                return record
            again = await self._enqueue(spec, None, 0, blocked, scoped=False, seeds=set(spec.seeds))
            if again["counts"].get("blocked", 0) == len(blocked):
                return record  # refused still: nothing to rewrite
            counts = Counter(record.get("counts") or {})
            counts["blocked"] -= len(blocked)
            counts.update({k: v for k, v in again["counts"].items() if k != "discovered"})
            rewritten = {**record, "counts": dict(counts),
                         "queued": list(dict.fromkeys([*(record.get("queued") or ()), *again["queued"]])),
                         "skipped": [*(s for s in (record.get("skipped") or ()) if s.get("reason") != "blocked"),
                                     *again["skipped"]]}
            if await self.state.rewrite_page(spec.crawl_id, SEEDS, rewritten, revision):
                log.info("crawl.seeds_rechecked", crawl_id=spec.crawl_id, queued=len(again["queued"]))
                return rewritten
            await asyncio.sleep(0)  # another process rewrote it first: read again

    # -- a rendered page --------------------------------------------------------------------

    async def keep(self, task: ScrapeTask, final_url: str, links: PageLinks | None) -> None:
        """Keep a page's links until they are followed (written before its result)."""
        assert task.crawl is not None
        final_url = bounds.cut(final_url, bounds.MAX_URL)
        kept = (await self._fit(links)).as_dict() if links else {}
        await self.state.save_links(task.crawl.crawl_id, task.task_id, {"final_url": final_url, **kept})

    async def _fit(self, links: PageLinks) -> PageLinks:
        """The links as ``keep`` stores them, so that this delivery follows what a redelivery
        would read back: within a CRAWLS value as the bucket has it (``state.room``), the final
        URL (``bounds.MAX_URL``) beside them."""
        return links.fit(await self.state.room() - bounds.MAX_URL * 4)

    async def follow(self, task: ScrapeTask, final_url: str | None = None, links: PageLinks | None = None) -> bool:
        """Queue the page's links (once). Without ``links``: those ``keep`` stored (a redelivery
        of a page whose result stands). False when there is nothing to follow from."""
        crawl = task.crawl
        assert crawl is not None
        started = time.perf_counter()
        if await self.state.page(crawl.crawl_id, task.task_id) is not None:
            return True  # an earlier delivery did it
        if links is None:
            kept = await self.state.links(crawl.crawl_id, task.task_id)
            if kept is None:
                return False
            final_url, links = kept.get("final_url") or task.url, PageLinks.from_js(kept)
        else:
            final_url, links = bounds.cut(final_url, bounds.MAX_URL) if final_url else final_url, await self._fit(links)
        spec = await self.state.spec(crawl.crawl_id)
        record: dict[str, Any] = {"url": task.url, "depth": crawl.depth, "parent": crawl.parent,
                                  "final_url": final_url}
        rules = await self.rules(spec, crawl.seeds_redirected)
        left = bool(final_url and final_url != task.url and rules.in_scope(task.url) and not rules.in_scope(final_url))
        if left and links.followable and crawl.depth == 0 and task.original_url in spec.seeds:
            assert final_url is not None
            rules, left = await self._widen(spec, final_url), False
            record["seed_redirected_to"] = final_url
        if not links.followable:
            record.update(counts={}, queued=[], not_followed="not_html")
        elif left:
            record.update(counts={}, queued=[], not_followed="redirected_out_of_scope")
        elif crawl.depth >= spec.depth or spec.scope == "page":
            record.update(counts={"discovered": links.total, "depth_cut": links.total}, queued=[],
                          not_followed="depth")
        else:
            record.update(await self._enqueue(spec, task.task_id, crawl.depth + 1, list(links.links), scoped=True,
                                              rules=rules))
            if links.total > len(links.links):
                record["links_cut"] = links.total - len(links.links)
        record["follow_ms"] = round((time.perf_counter() - started) * 1000, 2)  # bench/crawl.py reads it
        await self.state.record_page(crawl.crawl_id, task.task_id, record)
        await self.state.drop_links(crawl.crawl_id, task.task_id)
        self._measure(crawl.crawl_id, record)
        log.info("crawl.page_followed", crawl_id=crawl.crawl_id, depth=crawl.depth,
                 **{k: v for k, v in record["counts"].items() if v})
        return True

    async def give_up(self, task: ScrapeTask, error: BaseException) -> None:
        """The page's last delivery could not follow its links (robots.txt or NATS kept failing):
        the page stands, archived; its record says ``not_followed: follow_failed`` and counts its
        links ``follow_failed``, but for those an earlier go did queue (recognised by their
        parent), and the slots it still held go back. So the crawl ends, and says why it is short."""
        crawl = task.crawl
        assert crawl is not None
        if await self.state.page(crawl.crawl_id, task.task_id) is not None:
            return
        spec = await self.state.spec(crawl.crawl_id)
        links = PageLinks.from_js(await self.state.links(crawl.crawl_id, task.task_id) or {})
        ids = set()
        for raw in links.links:
            with contextlib.suppress(InputError):
                ids.add(self.task_id(spec, self._normalise(raw)))
        ids.discard(task.task_id)
        held = await asyncio.gather(*(self._held_by(t) for t in ids))
        queued = [t for t, by in zip(ids, held, strict=True) if by == task.task_id]
        await self.state.settle(spec.crawl_id, task.task_id, len(queued))
        reason = getattr(error, "reason", type(error).__name__)
        record = {"url": task.url, "depth": crawl.depth, "parent": crawl.parent, "link_depth": crawl.depth + 1,
                  "counts": {"discovered": links.total, "queued": len(queued),
                             "follow_failed": links.total - len(queued)},
                  "queued": queued, "skipped": [], "not_followed": "follow_failed", "error": f"{reason}: {error}"[:500]}
        await self.state.record_page(crawl.crawl_id, task.task_id, record)
        await self.state.drop_links(crawl.crawl_id, task.task_id)
        self._measure(crawl.crawl_id, record)
        log.warning("crawl.follow_failed", crawl_id=crawl.crawl_id, reason=reason, links=links.total)

    def _measure(self, crawl_id: str, record: dict[str, Any]) -> None:
        """The page record in this process's crawl metrics (labelled by crawl: a fleet's
        dashboard shows each crawl's progress without reading CRAWLS)."""
        if self.telemetry is None:
            return
        self.telemetry.crawl_pages.add(1, {"crawl_id": crawl_id, "how": record.get("not_followed") or "followed"})
        for outcome, n in (record.get("counts") or {}).items():
            if n:
                self.telemetry.crawl_links.add(n, {"crawl_id": crawl_id, "outcome": outcome})

    async def crawl_delay(self, task: ScrapeTask) -> float | None:
        """The ``Crawl-delay`` robots.txt asks of the task's host (obeying crawls only)."""
        assert task.crawl is not None
        spec = await self.state.spec(task.crawl.crawl_id)
        if spec.robots != "obey":
            return None
        return await self.robots.crawl_delay(spec.crawl_id, task.url, spec.robots_agent)

    # -- the one path into SEEN -------------------------------------------------------------

    async def _enqueue(self, spec: CrawlSpec, parent: str | None, depth: int, urls: list[str], *, scoped: bool,
                       seeds: set[str] | None = None, rules: ScopeRules | None = None) -> dict[str, Any]:
        rules = rules or await self.rules(spec)
        place = CrawlRef(crawl_id=spec.crawl_id, depth=depth, parent=parent, seeds_redirected=len(rules.redirected))
        counts: Counter[str] = Counter({k: 0 for k in OUTCOMES})
        skipped: list[dict[str, str]] = []

        def skip(url: str, why: str) -> None:
            counts[why] += 1
            if len(skipped) < MAX_SKIPPED:
                skipped.append({"url": url, "reason": why})

        candidates: dict[str, tuple[str, str]] = {}
        for raw in urls:
            counts["discovered"] += 1
            try:
                url = self._normalise(raw)
            except InputError as exc:
                skip(raw, "invalid")
                log.debug("crawl.invalid_link", url=raw, reason=exc.reason)
                continue
            if scoped and not (seeds and raw in seeds) and (why := rules.verdict(url)):
                skip(url, why)
                continue
            task_id = self.task_id(spec, url)
            if task_id in candidates or task_id == parent:
                counts["duplicate"] += 1
                continue
            candidates[task_id] = (url, raw)
        verdicts = await asyncio.gather(*(self._admissible(spec, url) for url, _ in candidates.values()))
        for (task_id, (url, _)), why in zip(list(candidates.items()), verdicts, strict=True):
            if why:
                skip(url, why)
                del candidates[task_id]
        if spec.max_pages is None and parent is not None:
            queued = await self._create_unbudgeted(spec, candidates, place)
            counts["duplicate"] += len(candidates) - len(queued)
        else:
            queued = await self._create_budgeted(spec, candidates, place, counts, skip)
        counts["queued"] = len(queued)
        return {"link_depth": depth, "counts": dict(counts), "queued": queued, "skipped": skipped}

    async def _create_budgeted(self, spec: CrawlSpec, candidates: dict[str, tuple[str, str]], place: CrawlRef,
                               counts: Counter[str], skip: Callable[[str, str], None]) -> list[str]:
        """Reserve budget slots for the candidates not in SEEN yet, create those granted, give back
        the slots of creates that lost; the ids this page queued (an earlier go's too)."""
        parent = place.parent
        queued: list[str] = []
        fresh = list(candidates)

        async def census() -> tuple[int, int]:
            """Sort the links still fresh by SEEN now: this page's (an earlier or a concurrent go
            made them, or seeding), another page's, or still fresh; (fresh, this page's)."""
            held = await asyncio.gather(*(self._held_by(t) for t in fresh))
            still = []
            for task_id, by in zip(list(fresh), held, strict=True):
                if by is None:
                    still.append(task_id)
                elif by == (parent or ""):
                    queued.append(task_id)
                else:
                    counts["duplicate"] += 1
            fresh[:] = still
            return len(fresh), len(queued)

        holder = parent or SEEDS
        granted, holds = await self.state.reserve(spec.crawl_id, holder, spec.max_pages, census)
        for task_id in fresh[granted:]:
            skip(candidates[task_id][0], "budget_cut")
        made = await asyncio.gather(*(self._create(spec, task_id, *candidates[task_id], place)
                                      for task_id in fresh[:granted]))
        queued += await self._made_by(place, fresh[:granted], made, counts)
        if holds:
            await self.state.settle(spec.crawl_id, holder, len(queued))
        return queued

    async def _create_unbudgeted(self, spec: CrawlSpec, candidates: dict[str, tuple[str, str]],
                                 place: CrawlRef) -> list[str]:
        """Create every candidate (no budget to reserve first); the ids this page queued: those it
        created now, and those an earlier (or a concurrent) go of it created, recognised by their
        parent in SEEN."""
        made = await asyncio.gather(*(self._create(spec, task_id, *candidates[task_id], place)
                                      for task_id in candidates))
        return await self._made_by(place, list(candidates), made)

    async def _made_by(self, place: CrawlRef, tried: list[str], made: list[bool],
                       counts: Counter[str] | None = None) -> list[str]:
        """Of the ``tried`` creates, the tasks in SEEN that are this page's: those this go
        created, and those another go of the same page created first (recognised by their
        parent, read again in SEEN); the rest are another page's (``duplicate``)."""
        queued = [task_id for task_id, created in zip(tried, made, strict=True) if created]
        lost = [task_id for task_id, created in zip(tried, made, strict=True) if not created]
        held = await asyncio.gather(*(self._held_by(t) for t in lost))
        for task_id, by in zip(lost, held, strict=True):
            if by == (place.parent or ""):
                queued.append(task_id)
            elif counts is not None:
                counts["duplicate"] += 1
        return queued

    async def _admissible(self, spec: CrawlSpec, url: str) -> str | None:
        """Why the network policy or robots.txt keeps ``url`` out, or None."""
        origin = origin_of(url)
        blocked = self._blocked.get(origin)
        if blocked is None:  # once per origin, not per link: the policy resolves the host's name
            try:
                await self.policy.check_url(url)
                blocked = False
            except PolicyBlocked:
                blocked = True
            except RetryableError:
                blocked = False  # cannot resolve now: the render will say (and retry)
            self._blocked[origin] = blocked
        if blocked:
            return "blocked"
        if spec.robots == "obey" and not await self.robots.allowed(spec.crawl_id, url, spec.robots_agent):
            return "robots_disallowed"
        return None

    async def _held_by(self, task_id: str) -> str | None:
        """None when SEEN has no task ``task_id``; else the parent of the one it has ("" for a seed)."""
        async with self._slots:
            try:
                stored = await self.js.get_last_msg(names.SEEN_STREAM, names.seen_key_subject(task_id))
            except nats.js.errors.NotFoundError:
                return None
        if not stored.data:
            return None  # a delete marker: gone
        try:
            task = decode(ScrapeTask, stored.data)
        except MessageDecodeError:
            return ""
        return (task.crawl.parent if task.crawl else None) or ""

    async def _create(self, spec: CrawlSpec, task_id: str, url: str, original: str, place: CrawlRef) -> bool:
        """Create the task in SEEN (so in TASKS) at ``place`` in the crawl; False when someone created it first."""
        task = ScrapeTask(task_id=task_id, url=url, original_url=original, steps=spec.steps, options=spec.options,
                          labels=spec.labels, crawl=place)
        headers = {names.EXPECTED_LAST_SUBJECT_SEQUENCE: "0", names.MSG_TTL: self._ttl}
        async with self._slots:
            try:
                await self.js.publish(names.seen_key_subject(task_id), encode(task), headers=headers)
            except nats.js.errors.APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    return False
                raise
        return True
