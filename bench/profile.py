"""Profile: where each page's time goes, in every process, at the bench's rate.

Runs (d) the shared-context Playwright loop (bench/bare.py) and then ``busscrape run`` on the
same pages of bench/site.py, each in a child process, and samples every process of its tree
from /proc twice a second: CPU seconds (user + system) per process class — the Python of the
run / worker / ingester / loop, Playwright's node driver, nats-server, Chromium's browser,
renderer, GPU and utility processes. Printed per page, so the two can be compared on a busy
machine: what busscrape adds over (d), process by process.

With ``--py-spy`` the busscrape run is started under ``py-spy record --subprocesses`` (raw
stacks; py-spy from PyPI) and the functions with the most samples in the worker's and the
ingester's Python are printed.

    .venv/bin/python bench/profile.py --pages 60 [--py-spy] [--no-full-page] [--artifacts html,screenshot,har,text,warc]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchsite import ORIGINS, BenchSite
from busscrape.settings import Settings, settings_env

TICK = os.sysconf("SC_CLK_TCK")

LOOP = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from bench.bare import shared_context_loop
urls = open(sys.argv[2]).read().split()
print(asyncio.run(shared_context_loop(urls, int(sys.argv[3]))))
"""


def classify(cmdline: str) -> str:
    if "nats-server" in cmdline:
        return "nats-server"
    if "chromium" in cmdline or "chrome" in cmdline:
        for kind in ("renderer", "gpu-process", "utility", "zygote"):
            if f"--type={kind}" in cmdline:
                return f"chromium {kind}"
        return "chromium browser"
    if "playwright" in cmdline and ("node" in cmdline or "driver" in cmdline):
        return "playwright driver"
    if "py-spy" in cmdline:
        return "py-spy"
    if "multiprocessing.forkserver" in cmdline or "multiprocessing.resource_tracker" in cmdline:
        return "python fork server"  # what run's daemons are forked from (ops/forks.py), and its helper
    for role in ("worker", "ingester", "run"):
        if f"busscrape {role}" in cmdline:
            return f"python {role}"
    return "python (loop)" if "python" in cmdline else "other"


class TreeSampler(threading.Thread):
    """CPU seconds per process class of ``root``'s process tree (last value seen per pid)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[int, tuple[str, float]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(0.5)

    def sample(self) -> None:
        children: dict[int, list[int]] = collections.defaultdict(list)
        stats = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                children[int(fields[1])].append(int(entry))
                stats[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
            except (OSError, ValueError, IndexError):
                continue
        stack, tree = [self.root], []
        while stack:
            pid = stack.pop()
            tree.append(pid)
            stack.extend(children.get(pid, []))
        for pid in tree:
            if pid not in stats:
                continue
            kind = self.seen.get(pid, ("", 0.0))[0]
            if not kind or kind == "python fork server":  # a fork names itself a moment after the fork
                try:
                    kind = classify(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
                except OSError:
                    continue
            self.seen[pid] = (kind, stats[pid])

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = collections.Counter()
        for kind, cpu in self.seen.values():
            out[kind] += cpu
        return dict(out)


def profiled(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, dict[str, float], str]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    out, err = proc.communicate(timeout=3600)
    sampler.stopped.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
    return time.perf_counter() - started, sampler.totals(), out


def top_functions(raw: Path, role: str, count: int = 12) -> list[tuple[str, float]]:
    """The leaf frames with the most samples in the processes whose command names ``role``."""
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        # --subprocesses roots each stack in its processes, parent first: the last one is its own.
        own = [f for f in frames if f.startswith("process ")][-1:]
        if not own or f"busscrape {role}" not in own[0] or not n.isdigit():
            continue
        total += int(n)
        leaves[frames[-1]] += int(n)
    return [(frame, 100 * n / total) for frame, n in leaves.most_common(count)] if total else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--raw-out", default=None, help="keep py-spy's raw stacks here")
    parser.add_argument("--no-full-page", action="store_true", help="busscrape with a viewport screenshot, like (d)")
    parser.add_argument("--artifacts", default=None, help="busscrape run --artifacts (html,screenshot,har,text,warc)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    with BenchSite(pages=997) as site, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        urls = site.urls(args.pages)
        (workdir / "urls.txt").write_text("".join(f"{u}&p=1\n" for u in urls))
        env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
        loop_s, loop_cpu, _ = profiled([sys.executable, "-c", LOOP, str(root), str(workdir / "urls.txt"),
                                        str(args.concurrency)], env, workdir)
        settings = Settings(state_dir=workdir / "state", network={"allow": [f"{o}/32" for o in ORIGINS]},
                            worker={"concurrency": args.concurrency, "host_concurrency": args.concurrency},
                            telemetry={"http_port": None, "log_level": "warning"})
        cmd = [sys.executable, "-m", "busscrape", "run", str(workdir / "urls.txt"), "--workers", "1"]
        if args.no_full_page:
            cmd.append("--no-full-page")
        if args.artifacts:
            cmd += ["--artifacts", args.artifacts]
        raw = workdir / "py-spy.txt"
        if args.py_spy:
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            cmd = [spy, "record", "--subprocesses", "--rate", "50", "--format", "raw", "-o", str(raw), "--", *cmd]
        run_s, run_cpu, _ = profiled(cmd, {**env, **settings_env(settings)}, workdir)
        pages = len(urls)
        print(f"{pages} pages, {args.concurrency} at a time; (d) shared-context loop {loop_s:.1f} s wall, "
              f"busscrape run {run_s:.1f} s wall (start-up included{', under py-spy' if args.py_spy else ''})")
        print(f"{'CPU ms per page':28} {'(d)':>8} {'busscrape':>10}")
        for kind in sorted(set(loop_cpu) | set(run_cpu), key=lambda k: -run_cpu.get(k, 0)):
            if kind == "py-spy":
                continue
            print(f"{kind:28} {1000 * loop_cpu.get(kind, 0) / pages:8.0f} {1000 * run_cpu.get(kind, 0) / pages:10.0f}")
        total_d = sum(v for k, v in loop_cpu.items() if k != "py-spy")
        total_b = sum(v for k, v in run_cpu.items() if k != "py-spy")
        print(f"{'total':28} {1000 * total_d / pages:8.0f} {1000 * total_b / pages:10.0f}  "
              f"ratio {total_b / total_d:.2f}")
        if args.py_spy and raw.exists():
            if args.raw_out:
                shutil.copy(raw, args.raw_out)
            for role in ("worker", "ingester"):
                print(f"py-spy, busscrape {role}: leaf frames with the most samples")
                for frame, share in top_functions(raw, role):
                    print(f"  {share:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
