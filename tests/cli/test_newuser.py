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


def test_run_whose_worker_exits_with_a_configuration_error_stops_at_once_with_its_message(site, tmp_path):
    """Issue 36.2: a bad politeness file makes the worker exit 2 at start; `run` used to wait
    forever ("queued 4 …"), the message only in the worker's log."""
    rules = tmp_path / "politeness.toml"
    rules.write_text('[[host]]\nglob = "*"\ndelay = "soon"\n')
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(site.url(f"/p{i}") + "\n" for i in range(4)))
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"), BUSSCRAPE_WORKER__HOST_RULES=str(rules),
                    BUSSCRAPE_NETWORK__ALLOW=json.dumps([f"{site.hosts[0]}/32"]))
    result = busscrape("run", str(urls), "-w", "1", "--json", env=env, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "worker-1 exited with a configuration error" in result.stderr, result.stderr
    assert str(rules) in result.stderr and "soon" in result.stderr, result.stderr
    summary = json.loads(result.stdout)
    assert summary["interrupted"] is False and "worker-1" in summary["error"]
