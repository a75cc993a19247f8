"""When each test ran, on which xdist worker, and the CPU it used (``BUSSCRAPE_TEST_TIMELINE=path``):
one JSON line a test, appended by every worker, so the makespan of a parallel run can be read afterwards
(``scripts/timeline.py path``: the busiest worker, the tests that ended last, idle workers)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest

from tests.support.environment import AT_START

PATH = AT_START.get("BUSSCRAPE_TEST_TIMELINE")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    start, cpu = time.time(), _cpu()
    try:
        return (yield)
    finally:
        if PATH:
            end, used = time.time(), _cpu() - cpu
            rows = []
            last = _LAST_TEARDOWN.pop(item.nodeid, None)
            if last is not None:
                # The worker's last test: its teardown also ends the module's and the session's
                # fixtures (the shared Chromium, the zygote, the servers), whose reaped processes
                # would otherwise count as this test's CPU. A row of their own.
                rows.append({"test": f"(the session's teardown, after {item.nodeid})", **last})
                end, used = last["start"], used - last["cpu"]
            rows.insert(0, {"test": item.nodeid, "start": start, "end": end, "cpu": used})
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(PATH, "a", encoding="utf-8") as out:
                for row in rows:
                    out.write(json.dumps({**row, "worker": worker}) + "\n")


_LAST_TEARDOWN: dict[str, dict[str, float]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    if nextitem is not None or not PATH:
        return (yield)
    start, cpu = time.time(), _cpu()
    try:
        return (yield)
    finally:
        _LAST_TEARDOWN[item.nodeid] = {"start": start, "end": time.time(), "cpu": _cpu() - cpu}


def _cpu() -> float:
    """CPU seconds (user + sys) of this process and of the children it has reaped: a daemon or a
    command a test ran counts once it has exited; what lives on (the session's Chromium, a
    container's processes under conmon) is not counted."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
