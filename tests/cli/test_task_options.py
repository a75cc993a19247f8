"""One set of task options for every command that queues tasks (dispatch, run), through the real CLI."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.support.cli import busscrape, clean_env


def flags_in_help(command: str) -> set[str]:
    result = busscrape(command, "--help", env=clean_env(COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"(--[a-z][a-z-]+)", result.stdout))


ISSUE_FLAGS = {"--rejects", "--json", "--format", "--strip-tracking", "--sort-query", "--viewport", "--wait-until",
               "--header", "--user-agent", "--block", "--jpeg-quality"}  # what run refused (#25)


def test_dispatch_and_run_take_every_task_option():
    for command in ("dispatch", "run"):
        assert ISSUE_FLAGS <= flags_in_help(command), command
    from busscrape.cli.options import TASK_OPTIONS

    shared = {decl.split("/")[0] for _, _, option in TASK_OPTIONS for decl in option.param_decls}
    assert ISSUE_FLAGS <= shared
    for command in ("dispatch", "run"):
        assert shared <= flags_in_help(command), command


@pytest.mark.browser
@pytest.mark.slow
async def test_run_applies_the_dispatch_options_it_is_given(tmp_path, site):
    from aiohttp import web

    seen: list[dict[str, str]] = []

    @site.route("/page")
    async def page(request):
        seen.append(dict(request.headers))
        return web.Response(text="<title>page</title><p>hello</p>", content_type="text/html")

    urls = tmp_path / "urls.list"
    urls.write_text(f"{site.url('/page?b=2&a=1&utm_source=x')}\nftp://nope/\n")
    rejects = tmp_path / "rejects.jsonl"
    env = clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state"), BUSSCRAPE_WORKER__CONCURRENCY="1",
                    BUSSCRAPE_NETWORK__ALLOW=",".join(f"{h}/32" for h in site.hosts))
    result = await asyncio.to_thread(
        busscrape, "run", str(urls), "--workers", "1", "--format", "urls", "--rejects", str(rejects), "--json",
        "--strip-tracking", "--sort-query", "--viewport", "640x480", "--wait-until", "load",
        "--header", "X-Busscrape-Test: yes", "--user-agent", "busscrape-test/1", "--block", "image",
        "--screenshot-format", "jpeg", "--jpeg-quality", "40", env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["archived"] == 1 and summary["dispatch"]["invalid"] == 1
    assert [json.loads(line)["reason"] for line in rejects.read_text().splitlines()] == ["unsupported_scheme"]
    [request] = seen
    assert request["User-Agent"] == "busscrape-test/1" and request["X-Busscrape-Test"] == "yes"
    [meta] = [json.loads(p.read_text()) for p in (tmp_path / "state" / "archive").glob("dt=*/host=*/*/meta.json")]
    assert meta["url"].endswith("/page?a=1&b=2")  # tracking stripped, query sorted
    assert any(o["name"] == "screenshot.jpg" for o in meta["objects"]), meta["objects"]
