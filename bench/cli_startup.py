"""Benchmark: how long ``busscrape --help`` and ``busscrape <command> --help`` take to answer.

A command line that takes a second to print its help feels broken; the CLI imports only what the
command it runs needs (``busscrape/cli/app.py``). Each case runs as a fresh process, alternating
with the baseline in the same run, so the machine's load falls on both alike:

- baseline: the interpreter importing typer and printing nothing (``python -c 'import typer'``),
  the floor for any typer CLI;
- ``busscrape --help`` and ``busscrape <command> --help`` for every command.

typer (0.2x) builds a command's parameters with pydantic, so a command's ``--help`` pays for
importing pydantic whatever busscrape does; busscrape itself imports nothing else for it.

    .venv/bin/python bench/cli_startup.py [--runs 15]

It prints the median wall time of each, its ratio to the baseline, and which heavy packages
(pydantic, nats, playwright, rich …) the ``--help`` of each command imported (none is the goal).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["dispatch", "run", "worker", "ingester", "status", "dlq", "task", "search", "api", "streams", "demo",
            "config", "version"]
HEAVY = ("pydantic_settings", "nats", "playwright", "rich", "structlog", "aiohttp", "orjson",
         "opentelemetry", "asyncio", "busscrape.settings", "obstore", "boto3")
GOAL = 0.4  # seconds for `busscrape --help` on the 2-core dev VM


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - started


def heavy_imports(args: list[str]) -> list[str]:
    """Which heavy packages the CLI imports to answer ``args`` (run in-process in a child)."""
    probe = ("import sys; sys.argv = ['busscrape', *sys.argv[1:]]\n"
             "from busscrape.cli import app\n"
             "try:\n    app(standalone_mode=False)\nexcept BaseException:\n    pass\n"
             f"print('HEAVY:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("HEAVY:")), "HEAVY:")
    return [m for m in line.removeprefix("HEAVY:").split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "busscrape"]
    cases = {"busscrape --help": [*cli, "--help"]} | {f"busscrape {c} --help": [*cli, c, "--help"] for c in COMMANDS}
    baseline_argv = [sys.executable, "-c", "import typer"]
    times: dict[str, list[float]] = {name: [] for name in cases}
    base: list[float] = []
    for _ in range(args.runs):
        for name, argv in cases.items():
            base.append(timed(baseline_argv))
            times[name].append(timed(argv))
    floor = statistics.median(base)
    print(f"{args.runs} runs each, alternating with the baseline; median wall time")
    label = "baseline: python -c 'import typer'"
    print(f"  {label:<36} {floor * 1000:7.0f} ms")
    worst = 0.0
    for name, samples in times.items():
        median = statistics.median(samples)
        worst = max(worst, median)
        command = name.split()[1] if name.count(" ") == 2 else None
        loaded = heavy_imports([command, "--help"] if command else ["--help"])
        print(f"  {name:<36} {median * 1000:7.0f} ms  {median / floor:4.2f}x baseline"
              f"  heavy imports: {', '.join(loaded) or 'none'}")
    top = statistics.median(times["busscrape --help"])
    print(f"busscrape --help: {top * 1000:.0f} ms (goal <= {GOAL * 1000:.0f} ms); slowest command help "
          f"{worst * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
