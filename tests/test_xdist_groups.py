"""The parallel run's groups hold (tests/support/xdist.py): the tests of one group run on one
xdist worker. pytest 9.2 with pytest-xdist 3.8 ignored every group without a word (the container
tests built their images and brought the same compose stack up on two workers at once), so this
runs a small suite through the suite's own collection hook, in parallel, and looks where each
test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The small suites load xdist alone: every other installed plugin (hypothesis, schemathesis, …)
# cost each of their processes ~1.7 s of CPU at start, 27 s of CPU for these two tests.
PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
XDIST = ["-p", "xdist.plugin"]

CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"

TESTS = '''
import json, os, time
from pathlib import Path
import pytest

def ran(name):
    time.sleep(0.3)  # long enough that a free worker would take the next test if it could
    with open(os.environ["WHERE"], "a") as out:
        out.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.containers
@pytest.mark.parametrize("i", range(4))
def test_in_containers(i):
    ran(f"containers{i}")

@pytest.mark.containers("compose")
@pytest.mark.parametrize("i", range(3))
def test_in_compose(i):
    ran(f"compose{i}")

@pytest.mark.long
@pytest.mark.parametrize("i", range(3))
def test_long(i):
    ran(f"long{i}")

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    ran(f"free{i}")
'''


def test_the_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(TESTS)
    where = tmp_path / "where.jsonl"
    env = {**os.environ, **PLUGINS, "PYTHONPATH": str(ROOT), "WHERE": str(where)}

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *XDIST, "-n", "3", "--dist", "loadgroup",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for line in where.read_text().splitlines():
        name, worker = json.loads(line)
        workers.setdefault(name.rstrip("0123456789"), set()).add(worker)
    assert len(workers["containers"]) == 1, workers
    assert len(workers["compose"]) == 1, workers
    assert len(workers["long"]) == 1, workers
    assert workers["free"], workers


ENV_TESTS = '''
import json, os
import pytest
from tests.conftest import ENV_AT_START

@pytest.mark.parametrize("i", range(4))
def test_sees(i):
    with open(os.environ["WHERE"], "a") as out:
        out.write(json.dumps([ENV_AT_START.get("BUSSCRAPE_CHAOS_SEED"), os.environ.get("BUSSCRAPE_CHAOS_SEED"),
                              os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
'''


def test_every_worker_reads_the_variables_meant_for_the_tests_and_runs_without_the_rest(tmp_path: Path) -> None:
    """The controller cleans BUSSCRAPE_* before xdist spawns the workers: BUSSCRAPE_REQUIRE_*,
    BUSSCRAPE_CHAOS_SEED and BUSSCRAPE_TEST_TIMELINE must still reach them (a required container
    test would otherwise skip on a worker), and the timeline gets a line for every test."""
    (tmp_path / "conftest.py").write_text(CONFTEST + 'pytest_plugins = ["tests.support.timeline"]\n')
    (tmp_path / "test_env.py").write_text(ENV_TESTS)
    where, timeline = tmp_path / "where.jsonl", tmp_path / "timeline.jsonl"
    env = {**os.environ, **PLUGINS, "PYTHONPATH": str(ROOT), "WHERE": str(where),
           "BUSSCRAPE_CHAOS_SEED": "4242", "BUSSCRAPE_TEST_TIMELINE": str(timeline)}

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *XDIST, "-n", "2",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = [json.loads(line) for line in where.read_text().splitlines()]
    assert len(seen) == 4 and {worker for _, _, worker in seen} <= {"gw0", "gw1"}, seen
    assert all(at_start == "4242" and now is None for at_start, now, _ in seen), seen
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    tests = [line for line in lines if not line["test"].startswith("(")]
    assert sorted(line["test"].rsplit("::", 1)[1] for line in tests) == [f"test_sees[{i}]" for i in range(4)]
    assert all(line["worker"] in ("gw0", "gw1") and line["end"] >= line["start"] for line in lines), lines
    # Each worker's session fixtures end in its last test's teardown: a row of their own, so that
    # what they reap is not that test's CPU.
    teardowns = [line for line in lines if line["test"].startswith("(the session's teardown, after ")]
    assert sorted(line["worker"] for line in teardowns) == sorted({line["worker"] for line in tests}), lines
