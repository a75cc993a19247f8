"""A ``crawl`` block in a JSONL task spec: the line's URL seeds a crawl through the dispatcher."""

from __future__ import annotations

from busscrape.bus import names
from busscrape.crawl.state import SEEDS, CrawlState
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.dispatch.inputs import LineParser, Rejection, TaskDefaults
from busscrape.model.messages import ScrapeTask, decode
from tests.support import crawl_site
from tests.support.bus import stream_messages


def test_a_bad_crawl_block_is_rejected_with_its_line_and_reason():
    parse = LineParser("jsonl", TaskDefaults())
    bad = parse(7, '{"url": "http://a.test/", "crawl": {"scope": "site"}}')
    assert isinstance(bad, Rejection) and bad.line == 7 and bad.reason == "invalid_crawl"
    assert "crawl: scope" in bad.detail
    good = parse(8, '{"url": "http://a.test/", "crawl": {"depth": 2}, "wait_until": "commit"}')
    assert not isinstance(good, Rejection) and good.crawl == {"depth": 2} and good.options.wait_until == "commit"


async def test_a_crawl_line_seeds_a_crawl_and_a_rerun_finds_it_seeded(applied, settings, site, tmp_path):
    crawl_site.install(site)
    s = settings.with_overrides(network={"allow": [f"{h}/32" for h in site.hosts]})
    path = tmp_path / "specs.jsonl"
    path.write_text(f'{{"url": "{site.url("/")}", "crawl": {{"depth": 1, "max_pages": 3}}, "labels": {{"j": "1"}}}}\n'
                    f'{{"url": "{site.url("/b")}"}}\n')
    crawls: list[str] = []
    async with Dispatcher(applied, s, on_crawl=crawls.append) as dispatcher:
        first = await dispatcher.dispatch(str(path))
    assert (first.read, first.published, first.invalid) == (2, 2, 0)
    tasks = [decode(ScrapeTask, m.data) for m in await stream_messages(applied.js, names.SEEN_STREAM)]
    seed = next(t for t in tasks if t.crawl is not None)
    assert seed.url == site.url("/") and seed.crawl.depth == 0 and seed.labels == {"j": "1"}
    assert seed.crawl.crawl_id == crawls[0]
    assert (await CrawlState(applied.js).page(crawls[0], SEEDS))["queued"] == [seed.task_id]
    async with Dispatcher(applied, s) as dispatcher:
        again = await dispatcher.dispatch(str(path))
    assert (again.published, again.already_seen) == (0, 2)  # resumed, nothing queued twice


async def test_a_crawl_line_whose_seed_was_blocked_runs_when_dispatched_again_with_the_allow_list(
        applied, settings, site, tmp_path):
    """Issue 36.1 (and 11): the rejection names the reason in words, and the same line dispatched
    again by a dispatcher whose policy allows the address queues the seed."""
    crawl_site.install(site)
    path = tmp_path / "crawl.jsonl"
    path.write_text(f'{{"url": "{site.url("/b")}", "crawl": {{"depth": 0}}}}\n')
    rejected: list[Rejection] = []
    async with Dispatcher(applied, settings, on_rejected=rejected.append) as dispatcher:
        first = await dispatcher.dispatch(str(path))
    [rejection] = rejected
    assert (first.published, rejection.reason) == (0, "crawl_seed_skipped")
    assert "the seed was not queued: blocked (the network policy refuses its address" in rejection.detail
    assert "[{" not in rejection.detail  # words, not a Python repr
    s = settings.with_overrides(network={"allow": [f"{site.hosts[0]}/32"]})
    crawls: list[str] = []
    async with Dispatcher(applied, s, on_crawl=crawls.append) as dispatcher:
        again = await dispatcher.dispatch(str(path))
    assert (again.published, again.invalid) == (1, 0)
    record = await CrawlState(applied.js).page(crawls[0], SEEDS)
    assert len(record["queued"]) == 1 and record["counts"]["blocked"] == 0 and record["skipped"] == []
