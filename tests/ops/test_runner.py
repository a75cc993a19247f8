"""``ops.runner``: the embedded server and the daemons started side by side."""

from __future__ import annotations

import socket

import pytest

from busscrape.ops import runner
from busscrape.ops.runner import Runner, RunOptions
from busscrape.settings import Settings

pytestmark = [pytest.mark.browser, pytest.mark.slow]


async def test_a_run_whose_chosen_port_was_taken_meanwhile_starts_its_server_and_daemons_again(
        tmp_path, site, monkeypatch):
    site.page("/one", "<title>one</title><p>one</p>")
    urls = tmp_path / "urls.txt"
    urls.write_text(site.url("/one") + "\n")
    # Another process takes the port between the run's choice and the server's start.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setattr(runner, "free_port", lambda host: taken.getsockname()[1])
    settings = Settings(state_dir=tmp_path / "state", network={"allow": [f"{h}/32" for h in site.hosts]},
                        worker={"concurrency": 1}, telemetry={"http_port": None, "log_format": "json"})
    try:
        summary = await Runner(settings, RunOptions(source=str(urls), workers=1)).run()
    finally:
        taken.close()
    assert summary.archived == 1 and summary.complete, summary
    assert summary.failed_daemons == []
