#!/usr/bin/env python3
"""Read a parallel run's timeline (``BUSSCRAPE_TEST_TIMELINE``, tests/support/timeline.py): each
worker's busy time and last end, the longest tests and modules, the tests that used the most CPU,
and the tests that ended last.

    BUSSCRAPE_TEST_TIMELINE=/tmp/t.jsonl make test; scripts/timeline.py /tmp/t.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def is_test(row: dict) -> bool:
    """A test's row, not a session teardown's (a worker's last test's teardown ends the session's
    fixtures: a row of its own, named in parentheses; tests/support/timeline.py)."""
    return not row["test"].startswith("(")


def module(row: dict) -> str:
    """The test's module; the session teardowns counted together."""
    return row["test"].split("::", 1)[0] if is_test(row) else "(session teardowns)"


def main(path: str, top: int = 15) -> None:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    t0 = min(r["start"] for r in rows)
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    print(f"{sum(map(is_test, rows))} tests, makespan {max(r['end'] for r in rows) - t0:.0f} s")
    for worker, tests in sorted(by_worker.items()):
        busy = sum(r["end"] - r["start"] for r in tests)
        print(f"{worker}: {sum(map(is_test, tests))} tests, busy {busy:.0f} s, "
              f"first {min(r['start'] for r in tests) - t0:.0f} s, "
              f"last end {max(r['end'] for r in tests) - t0:.0f} s")
    print("longest tests:")
    for r in sorted(rows, key=lambda r: r["start"] - r["end"])[:top]:
        print(f"  {r['end'] - r['start']:6.1f} s  {r['worker']}  at {r['start'] - t0:5.0f} s  {r['test']}")
    if all("cpu" in r for r in rows):
        print(f"CPU in the tests: {sum(r['cpu'] for r in rows):.0f} s; the most:")
        for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
            print(f"  {r['cpu']:6.1f} s CPU in {r['end'] - r['start']:6.1f} s  {r['test']}")
        cpu: dict[str, float] = defaultdict(float)
        for r in rows:
            cpu[module(r)] += r["cpu"]
        print("most CPU by module:")
        for name, total in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {total:6.1f} s  {name}")
    modules: dict[str, float] = defaultdict(float)
    for r in rows:
        modules[module(r)] += r["end"] - r["start"]
    print("longest modules:")
    for name, total in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {total:6.1f} s  {name}")
    print("last to end:")
    for r in sorted(rows, key=lambda r: -r["end"])[:8]:
        print(f"  ends {r['end'] - t0:5.0f} s  ({r['end'] - r['start']:5.1f} s)  {r['worker']}  {r['test']}")


if __name__ == "__main__":
    main(sys.argv[1])
