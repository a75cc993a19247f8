"""``ops.runner``: the embedded server and the daemons started side by side."""

from __future__ import annotations

import socket

import pytest

from busscrape.errors import ConfigurationError
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


async def test_a_malformed_extractor_file_stops_the_run_and_the_daemons_it_had_spawned(tmp_path, monkeypatch):
    """The daemons are spawned before the extractor folder is read (it takes their start's
    time): a malformed file still ends the run with the file's error, and nothing it started
    stays behind."""
    (tmp_path / "ex").mkdir()
    (tmp_path / "ex" / "shop.toml").write_text('version = 1\n[fields.price]\ncss = ".p"\ntype = "money"\n')
    urls = tmp_path / "urls.txt"
    urls.write_text("http://127.0.0.2:9/one\n")
    spawned: list[runner.Daemons] = []

    class Recorded(runner.Daemons):
        async def __aenter__(self) -> runner.Daemons:
            spawned.append(self)
            return await super().__aenter__()

    monkeypatch.setattr(runner, "Daemons", Recorded)
    settings = Settings(state_dir=tmp_path / "state", extract={"dir": tmp_path / "ex"},
                        telemetry={"http_port": None, "log_format": "json"})
    with pytest.raises(ConfigurationError, match=r"shop\.toml: fields\.price\.type"):
        await Runner(settings, RunOptions(source=str(urls), workers=1)).run()
    processes = [d.process for daemons in spawned for d in daemons.daemons]
    assert processes and all(p is not None and p.poll() is not None for p in processes)
    assert not list((tmp_path / "state" / "pids").glob("*.json"))
