"""When each test ran, on which xdist worker (``BUSSCRAPE_TEST_TIMELINE=path``): one JSON line a
test, appended by every worker, so the makespan of a parallel run can be read afterwards
(``scripts/timeline.py path``: the busiest worker, the tests that ended last, idle workers)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import pytest

from tests.support.environment import AT_START

PATH = AT_START.get("BUSSCRAPE_TEST_TIMELINE")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    start = time.time()
    try:
        return (yield)
    finally:
        if PATH:
            line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                    "start": start, "end": time.time()}
            with open(PATH, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
