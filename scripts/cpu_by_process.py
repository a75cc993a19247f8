#!/usr/bin/env python3
"""CPU used on this machine while a command runs, by process kind (Chromium, node, nats-server …).

    scripts/cpu_by_process.py [--every 0.5] -- make test

Samples /proc every ``--every`` seconds and keeps, for each process seen, the most CPU it had
used (user + system); at the end prints the total per kind, the kind being the executable's
name (a Python process is named by its script or module: ``python:pytest``, ``python:moto_server``).
A process that lives shorter than one interval, or the CPU a process used after the last sample
that saw it, is not counted: the figures are a lower bound, good for where the CPU goes rather
than for its exact sum. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


# ``python -c`` processes, by what their code names. The test zygote's forks (the commands and
# daemons the tests start: tests/support/zygote.py) keep the zygote's command line.
_PYTHON_C = (
    (b"tests.support.zygote", "python:test zygote and its forks (the tests' commands and daemons)"),
    (b"multiprocessing.forkserver", "python:fork server of run, crawl and demo (its daemons: busscrape)"),
    (b"multiprocessing.resource_tracker", "python:multiprocessing resource tracker"),
    (b"exec(eval(", "python:pytest-xdist workers"),
)


def kind(pid: str) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if len([a for a in argv if a]) == 1:  # Chromium's helpers rewrite their argv into one string
        argv = argv[0].split(b" ")
    exe = os.path.basename(argv[0].decode(errors="replace")) if argv and argv[0] else ""
    if exe.startswith("chromium"):
        role = next((a[7:].decode() for a in argv if a.startswith(b"--type=")), "browser")
        return f"chromium {role}"
    if exe.startswith("python"):
        rest = [a.decode(errors="replace") for a in argv[1:] if a and not a.startswith(b"-")]
        if len(argv) > 2 and argv[1] == b"-m":
            return f"python:-m {argv[2].decode(errors='replace')}"
        if b"-c" in argv[1:3]:
            at = argv.index(b"-c") + 1
            code = argv[at] if at < len(argv) else b""
            for marker, name in _PYTHON_C:
                if marker in code:
                    return name
            return "python -c (other)"
        return f"python:{os.path.basename(rest[0])}" if rest else "python"
    return exe or None


def stat(pid: str) -> tuple[str, float] | None:
    """The process's start time (with its pid, what names it: pids are reused) and CPU so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19], (int(fields[11]) + int(fields[12])) / TICK


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    seen: dict[tuple[str, str], float] = {}  # (pid, its start time) -> most CPU seen
    kinds: dict[tuple[str, str], str] = {}
    before: dict[tuple[str, str], float] = {}  # what processes running already had used

    def sample(into: dict[tuple[str, str], float]) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            if (read := stat(pid)) is None:
                continue
            start, used = read
            key = (pid, start)
            if key not in kinds:
                found = kind(pid)
                if found is None:
                    continue
                kinds[key] = found
            into[key] = max(into.get(key, 0.0), used)

    sample(before)
    started = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen)
        time.sleep(args.every)
    wall = time.monotonic() - started
    totals: collections.Counter[str] = collections.Counter()
    for key, used in seen.items():
        totals[kinds[key]] += used - before.get(key, 0.0)
    print(f"\n{wall:.0f} s wall; CPU seen {sum(totals.values()):.0f} s "
          f"(the machine had {wall * (os.cpu_count() or 1):.0f} core-seconds):", file=sys.stderr)
    for name, used in totals.most_common(25):
        print(f"  {used:8.1f} s  {name}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
