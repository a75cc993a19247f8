"""Issue 36: every README command as a new user runs it, through the real entry point."""

from __future__ import annotations

import json

from busscrape.bus import names
from tests.support import crawl_site
from tests.support.bus import stream_messages
from tests.support.cli import busscrape, clean_env


async def test_crawl_detach_of_a_blocked_seed_says_so_exits_2_and_runs_once_allowed(applied, nats_url, site,
                                                                                      tmp_path):
    crawl_site.install(site)
    env = clean_env(BUSSCRAPE_NATS__URL=nats_url, BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    seed = site.url("/b")
    blocked = busscrape("crawl", seed, "--depth", "0", "--detach", env=env)
    assert blocked.returncode == 2, blocked.stdout + blocked.stderr
    assert "nothing to crawl" in blocked.stderr and seed in blocked.stderr and "--allow" in blocked.stderr
    allowed = busscrape("crawl", seed, "--depth", "0", "--detach", "--allow", site.hosts[0], "--json", env=env)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    started = json.loads(allowed.stdout)
    assert started["seeds"]["queued"] == 1 and started["seeds"]["blocked"] == 0
    [msg] = await stream_messages(applied.js, names.SEEN_STREAM)
    assert json.loads(msg.data)["url"] == seed
