"""The smaller things a new user met (#25, item 10), through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

from busscrape import __version__
from busscrape.bus import names
from tests.support.bus import has_messages, wait_until
from tests.support.cli import busscrape, clean_env


def test_version_flag():
    result = busscrape("--version")
    assert (result.returncode, result.stdout) == (0, f"{__version__}\n")


def test_reindex_from_a_folder_that_is_not_there_is_refused_and_creates_nothing(tmp_path):
    missing = tmp_path / "nonexistent"
    result = busscrape("search", "--reindex", "--archive", str(missing),
                       env=clean_env(BUSSCRAPE_STATE_DIR=str(tmp_path / "state")))
    assert result.returncode == 2 and f"--archive {missing}: no such folder" in result.stderr
    assert not missing.exists()


async def test_jsonl_on_stdin_is_read_as_task_specs_without_format(applied, nats_url, tmp_path):
    env = clean_env(BUSSCRAPE_NATS__URL=nats_url, BUSSCRAPE_STATE_DIR=str(tmp_path / "state"))
    spec = {"url": "https://example.com/sniffed", "labels": {"from": "stdin"}, "artifacts": ["html"]}
    result = busscrape("dispatch", "-", "--json", env=env, stdin="# specs\n" + json.dumps(spec) + "\n")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["published"], summary["invalid"]) == (1, 0), summary
    # TASKS sources the task from SEEN after the dispatch's PubAck, a moment later.
    await wait_until(lambda: has_messages(applied.js, names.TASKS_STREAM), timeout=10)
    [msg] = [await applied.js.get_msg(names.TASKS_STREAM, 1)]
    task = json.loads(msg.data)
    assert task["labels"] == {"from": "stdin"} and task["options"]["artifacts"] == ["html"]
    urls = busscrape("dispatch", "-", "--json", env=env, stdin="https://example.com/a-url\n")
    assert json.loads(urls.stdout)["published"] == 1  # a URL list is still a URL list


async def test_dlq_show_of_no_letter_is_exit_1_as_the_docs_say(applied, nats_url):
    result = busscrape("dlq", "show", "99", env=clean_env(BUSSCRAPE_NATS__URL=nats_url))
    assert result.returncode == 1 and "no dead letter at seq 99" in result.stderr
    docs = (Path(__file__).parents[2] / "docs" / "status.md").read_text()
    assert "1 `show SEQ` of no letter" in docs and "`purge` answered N (nothing deleted)" in docs
