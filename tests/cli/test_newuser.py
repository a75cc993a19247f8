"""Issue 36: every README command as a new user runs it, through the real entry point."""

from __future__ import annotations

import json
import os

import pytest
from aiohttp import web

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


async def test_a_crawl_whose_seeds_robots_txt_cannot_be_read_says_so_and_starts_when_asked_again(
        applied, nats_url, site, tmp_path):
    """robots.txt answering 503 at seeding: a message naming it and what to do, exit 2, nothing
    queued (it ended in a traceback); the same command once robots.txt answers starts the crawl."""
    served = {"status": 503}

    @site.route("/robots.txt")
    async def robots(request: web.Request) -> web.Response:
        return web.Response(status=served["status"], text="User-agent: *\nAllow: /\n")

    site.page("/", "<title>home</title>")
    env = clean_env(BUSSCRAPE_NATS__URL=nats_url, BUSSCRAPE_STATE_DIR=str(tmp_path / "state"),
                    BUSSCRAPE_NETWORK__ALLOW=json.dumps([f"{site.hosts[0]}/32"]))
    seed = site.url("/")
    refused = busscrape("crawl", seed, "--depth", "0", "--detach", env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "Traceback" not in refused.stderr and "nothing queued" in said and "robots.txt" in said
    assert "503" in said and "--robots ignore" in said
    assert await stream_messages(applied.js, names.SEEN_STREAM) == []
    served["status"] = 200
    again = busscrape("crawl", seed, "--depth", "0", "--detach", "--json", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["seeds"]["queued"] == 1


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


def test_extractors_are_found_outside_the_repository_and_a_folder_of_ones_own_adds_to_them(tmp_path):
    """Issue 36.7: the bundled extractors are found wherever busscrape runs (as the streams are),
    and BUSSCRAPE_EXTRACT__DIR's are added (used to be: an empty table outside the repository)."""
    own = tmp_path / "extractors"
    own.mkdir()
    (own / "mine.toml").write_text('version = 1\n[fields.title]\ncss = "title"\n')
    result = busscrape("extractors", "list", env=clean_env(COLUMNS="200"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "demo-product" in result.stdout and "mine" in result.stdout, result.stdout


async def test_dispatch_and_run_check_the_extractor_name(applied, nats_url, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("https://example.com/x\n")
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    refused = busscrape("run", str(urls), "--extractor", "nope", env=env, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--extractor nope: no extractor 'nope'" in refused.stderr and "demo-product" in refused.stderr
    assert not (tmp_path / "state").exists()  # refused before anything started
    remote = clean_env(BUSSCRAPE_NATS__URL=nats_url, BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    warned = busscrape("dispatch", str(urls), "--extractor", "nope", "--json", env=remote, cwd=tmp_path)
    assert warned.returncode == 0 and "warning: --extractor nope" in warned.stderr, warned.stderr
    known = busscrape("dispatch", str(urls), "--extractor", "demo-product", "--force", env=remote, cwd=tmp_path)
    assert known.returncode == 0 and "warning" not in known.stderr, known.stderr


def archived_record(archive, record: dict, extractor: str = "demo-product") -> None:
    folder = archive / "dt=2026-01-02" / "host=shop.test" / "t1"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    (folder / "extracted.json").write_text(json.dumps({
        "extractor": extractor, "task_id": "t1", "url": "http://shop.test/k", "scraped_at": "2026-01-02T10:00:00+00:00",
        "version": 1, "record": record}))


REVIEWED = {"name": "Kettle", "price": "19.90", "currency": "EUR", "availability": "InStock",
            "reviews": [{"author": "ann", "rating": 5, "date": "2026-01-01"}, {"author": "bob", "rating": None,
                                                                              "date": None}]}


def test_export_parquet_types_nested_dates_as_date32_in_a_list_of_structs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    archived_record(tmp_path / "archive", REVIEWED)
    out = tmp_path / "p.parquet"
    result = busscrape("export", "--extractor", "demo-product", "--format", "parquet", "-o", str(out),
                       "--archive", str(tmp_path / "archive"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    schema = pq.read_schema(out)
    assert schema.field("price").type == pa.decimal128(38, 2)
    assert schema.field("reviews").type == pa.list_(pa.struct([("author", pa.string()), ("rating", pa.int64()),
                                                               ("date", pa.date32())]))
    [row] = pq.read_table(out).to_pylist()
    assert row["reviews"][0]["date"].isoformat() == "2026-01-01" and row["reviews"][1]["date"] is None


def test_export_parquet_without_pyarrow_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "blocker"
    (blocker / "pyarrow").mkdir(parents=True)
    (blocker / "pyarrow" / "__init__.py").write_text("raise ImportError('pyarrow is not installed here')\n")
    archived_record(tmp_path / "archive", REVIEWED)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]))
    result = busscrape("export", "--extractor", "demo-product", "--format", "parquet", "-o", str(tmp_path / "p.pq"),
                       "--archive", str(tmp_path / "archive"), env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "error: --format parquet needs pyarrow: pip install 'busscrape[export]'"


def test_export_of_an_extractor_nobody_has_is_exit_2(tmp_path):
    (tmp_path / "archive").mkdir()
    result = busscrape("export", "--extractor", "nope", "--archive", str(tmp_path / "archive"), cwd=tmp_path)
    assert result.returncode == 2 and "no extractor 'nope'" in result.stderr, result.stderr
    archived_record(tmp_path / "archive", {"x": 1}, extractor="gone")  # its file removed since: still exported
    kept = busscrape("export", "--extractor", "gone", "--archive", str(tmp_path / "archive"), cwd=tmp_path)
    assert kept.returncode == 0 and json.loads(kept.stdout)["x"] == 1, kept.stderr


def test_reindex_of_a_state_dir_with_no_archive_is_refused_and_creates_nothing(tmp_path):
    state = tmp_path / "new"
    result = busscrape("search", "--reindex", env=clean_env(BUSSCRAPE_STATE_DIR=str(state)), cwd=tmp_path)
    assert result.returncode == 2 and f"no archive at {state / 'archive'}" in result.stderr, result.stderr
    assert not state.exists()


def test_crawl_status_not_found_is_1_and_a_malformed_id_is_2(applied, nats_url, tmp_path):
    env = clean_env(BUSSCRAPE_NATS__URL=nats_url)
    missing = busscrape("crawl", "status", "deadbeefdeadbeef", env=env, cwd=tmp_path)
    assert missing.returncode == 1 and "no crawl deadbeefdeadbeef" in missing.stderr, missing.stderr
    malformed = busscrape("crawl", "status", "nothex", env=env, cwd=tmp_path)
    assert malformed.returncode == 2 and "16 lower-case hex" in malformed.stderr, malformed.stderr


def test_crawl_help_lists_no_flag_crawl_refuses_and_the_refusal_says_why(tmp_path):
    shown = busscrape("crawl", "--help", env=clean_env(COLUMNS="200"), cwd=tmp_path)
    assert shown.returncode == 0 and "--label" in shown.stdout
    for flag in ("--format", "--rejects", "--strict", "--force"):
        assert flag not in shown.stdout, flag
    refused = busscrape("crawl", "http://x.test/", "--force", cwd=tmp_path)
    assert refused.returncode == 2 and "--force is not for `busscrape crawl`" in refused.stderr


def test_wacz_of_a_folder_that_is_not_there_says_so(tmp_path):
    (tmp_path / "archive").mkdir()
    result = busscrape("wacz", "x", "--folder", "nope/nope", "--archive", str(tmp_path / "archive"), cwd=tmp_path)
    assert result.returncode == 2 and "nope/nope: no meta.json" in result.stderr, result.stderr


async def test_sessions_commands_reopen_the_state_dirs_nats_and_say_what_they_did(tmp_path):
    """Issue 36.9 and 18: after `run --session` on the embedded default, `sessions` reaches the
    run's store as status and dlq do; drop names what it dropped; list --json has ISO times."""
    import time

    from busscrape.bus import provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.ops.nats_server import EmbeddedNatsServer
    from busscrape.worker.sessions import SessionStore, Stored
    from tests.conftest import make_settings

    state = tmp_path / "state"
    with EmbeddedNatsServer(state / "nats") as server:  # what an embedded run leaves behind
        s = make_settings(tmp_path, server.url)
        async with await Bus.connect(s, name="setup") as bus:
            await provision.apply(bus.js, topology.load(s))
            await SessionStore(bus.js).put(Stored(name="shop-1", state={"cookies": []}, logged_in_at=time.time(),
                                                  expires_at=time.time() + 3600))
    env = clean_env(BUSSCRAPE_STATE_DIR=str(state))
    listed = busscrape("sessions", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = json.loads(listed.stdout)
    assert row["session"] == "shop-1" and row["expires_at"].endswith("+00:00") and "T" in row["logged_in_at"]
    dropped = busscrape("sessions", "drop", "shop-1", "nope", env=env, cwd=tmp_path)
    assert dropped.returncode == 1 and "dropped session shop-1" in dropped.stdout, dropped.stdout + dropped.stderr
    assert "no session nope" in dropped.stderr


def test_config_shows_lists_and_mappings_in_the_form_they_are_set(tmp_path):
    allow = '["127.0.0.2/32","intranet:443"]'
    result = busscrape("config", env=clean_env(BUSSCRAPE_NETWORK__ALLOW=allow, COLUMNS="400"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if "BUSSCRAPE_NETWORK__ALLOW " in line]
    assert allow in line and "['" not in line, line


async def test_off_a_terminal_help_is_not_cut_and_dlq_show_is_not_padded(applied, nats_url, tmp_path):
    """Issue 36.19: piped, `--help` keeps each command's whole first sentence and `dlq show`'s
    lines end where their text does."""
    from busscrape.deadletters import filing
    from busscrape.model.messages import DeadLetter

    helped = busscrape("--help", cwd=tmp_path)
    assert helped.returncode == 0
    assert not [line for line in helped.stdout.splitlines() if line.endswith("...") and "Usage" not in line]
    assert "de-duplicate every URL in INPUT, and queue one task per new URL." in helped.stdout
    await filing.file(applied.js, DeadLetter(task_id="a" * 32, stage="worker", reason="http_404", error="HTTP 404",
                                             url="http://shop.test/x"), msg_id="newuser-19")
    seq = (await applied.js.stream_info(names.DEADLETTER_STREAM)).state.last_seq
    shown = busscrape("dlq", "show", str(seq), env=clean_env(BUSSCRAPE_NATS__URL=nats_url), cwd=tmp_path)
    assert shown.returncode == 0 and "http_404" in shown.stdout, shown.stderr
    assert [line for line in shown.stdout.splitlines() if line != line.rstrip(" ")] == []


def test_crawl_table_says_what_was_queued_and_why_links_were_not_followed_in_words():
    from busscrape.cli.crawl import crawl_table
    from busscrape.crawl.progress import summarise

    pages = {"seeds": {"depth": -1, "link_depth": 0, "counts": {"discovered": 1, "queued": 1}, "queued": ["t"]},
             "t": {"url": "http://x.test/", "depth": 0, "counts": {"discovered": 2, "depth_cut": 2},
                   "not_followed": "depth"}}
    summary = summarise("c" * 16, pages)
    summary.budget_used = 1
    caption = crawl_table(summary).caption
    assert "1 queued" in caption and "budget" not in caption, caption
    assert "1 page(s) at --depth" in caption, caption
    summary.max_pages = 5
    assert "1 of --max-pages 5 queued" in crawl_table(summary).caption


def test_crawl_progress_does_not_claim_a_dispatch(capsys):
    from collections import Counter

    from busscrape.cli.run import ProgressDisplay

    ProgressDisplay().update(Counter({"queued": 1}), None, 1.0)
    line = capsys.readouterr().err
    assert line.startswith("queued 1 ·") and "dispatched" not in line, line


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--scope", "bogus", "--scope 'bogus': must be one of 'page', 'prefix', 'host', 'domain' or 'any'"),
    ("--include", "(", "--include: '(' is not a regular expression"),
    ("--sitemap-since", "yesterday", "--sitemap-since 'yesterday': must be an ISO 8601 date or time"),
    ("--depth", "-1", "--depth -1: must be at least 0"),
    ("--depth", "x", "Invalid value for '--depth': 'x': not an integer"),
    ("--max-pages", "many", "Invalid value for '--max-pages': 'many': not an integer"),
])
def test_crawl_flag_errors_name_the_flag_the_value_and_what_it_accepts(tmp_path, flag, value, said):
    result = busscrape("crawl", "http://x.test/", flag, value, cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert "Input should" not in result.stderr and "Value error" not in result.stderr


@pytest.mark.browser
@pytest.mark.slow
def test_crawl_and_run_say_what_they_did_as_documented(tmp_path, site):
    """#36.17 through the commands: a crawl without --max-pages claims no budget and says in words
    why links were not followed, its progress line claims no dispatch; every key of `run --json`
    is in the documentation's list."""
    from pathlib import Path

    from tests.support import pages

    crawl_site.install(site)
    pages.install(site)
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    opened = [arg for h in site.hosts for arg in ("--allow", f"{h}/32")]
    crawled = busscrape("crawl", site.url("/"), "--depth", "1", "--robots", "ignore", "-w", "1", *opened, env=env,
                        cwd=tmp_path, timeout=300)
    assert crawled.returncode == 0, crawled.stderr[-3000:]
    caption = " ".join(crawled.stdout.split())
    assert " queued" in caption and "budget" not in caption and "--max-pages" not in caption, caption
    assert "links not followed on " in caption and " page(s) at --depth" in caption, caption
    progress = [line for line in crawled.stderr.splitlines() if " · archived " in line]
    assert progress and all(line.startswith("queued ") for line in progress), crawled.stderr
    (tmp_path / "urls.txt").write_text(site.url("/static") + "\n")
    ran = busscrape("run", "urls.txt", "--json", "-w", "1", *opened[:2], env=env, cwd=tmp_path, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    doc = json.loads(ran.stdout.strip().splitlines()[-1])
    assert doc["archived_now"] == 1 and "earlier" in doc
    documented = Path(__file__).parents[2].joinpath("docs", "getting-started.md").read_text()
    assert [key for key in doc if f"`{key}`" not in documented] == []
