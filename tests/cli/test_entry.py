"""The entry point's early guess of the commands that fork daemons (``busscrape.entry``)."""

import pytest

from busscrape.entry import forks_daemons


@pytest.mark.parametrize(("args", "forks"), [
    (["run", "urls.txt"], True),
    (["crawl", "https://example.org/", "--max-pages", "5"], True),
    (["demo"], True),
    (["run", "urls.txt", "--nats-url", "nats://127.0.0.1:4222"], False),
    (["run", "urls.txt", "--nats-url=nats://127.0.0.1:4222"], False),
    (["run", "urls.txt", "--nats-url", "nats://127.0.0.1:4222", "--with-daemons"], True),
    (["run", "--help"], False),
    (["crawl", "status", "0123456789abcdef"], False),
    (["crawl", "https://example.org/", "--detach"], False),
    (["worker"], False),
    (["dispatch", "urls.txt"], False),
    ([], False),
])
def test_only_the_commands_that_start_local_daemons_start_the_fork_server_early(args, forks):
    assert forks_daemons(args) is forks
