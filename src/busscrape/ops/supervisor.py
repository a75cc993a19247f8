"""Local worker and ingester processes for ``busscrape run``: started, watched, stopped.

Each daemon is ``python -m busscrape worker|ingester`` in its own process (one Chromium per
worker process; both cores busy) — under the command line a fork of its warm fork server
(``ops.forks``), under the Python API a fresh interpreter —, configured through the environment with exactly the
settings of the run, logging JSON lines to ``<state_dir>/logs/<name>.log``. They die with the
supervisor, however it ends (``ops.lifeline``: parent-death signal, lifeline pipe, pid files). A daemon that
dies unexpectedly is started again (its in-flight tasks come back to the queue after
ack_wait). ``stop()`` sends SIGTERM (they drain: in-flight tasks finish or go back to the
queue), then SIGKILL after the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from busscrape.errors import EXIT_PARTIAL
from busscrape.ops import forks
from busscrape.ops.lifeline import Lifeline, PidFiles, die_with_parent
from busscrape.settings import Settings, settings_env

log = structlog.get_logger("busscrape.daemons")

MAX_RESTARTS = 5


@dataclass
class Daemon:
    name: str
    args: list[str]
    process: subprocess.Popen[bytes] | forks.Forked | None = None
    restarts: int = 0
    log_path: Path = field(default_factory=Path)


class Daemons:
    """A small supervisor. Async context manager: ``async with Daemons(settings, workers=2) as d``."""

    def __init__(self, settings: Settings, *, workers: int, ingesters: int = 1,
                 wait_streams: float | None = None, on_fatal: Callable[[int, str], None] | None = None) -> None:
        self.settings = settings
        self.on_fatal = on_fatal
        """Called once (exit code, message) when the fleet cannot go on: a daemon exited with a
        configuration error (it would repeat on every restart), or no worker is left alive."""
        self._fatal_said = False
        self.log_dir = settings.state_dir / "logs"
        # Children must not fight over one health port, and log machine-readable lines.
        telemetry = settings.telemetry.model_copy(update={"http_port": None, "log_format": "json"})
        self.env = settings_env(settings.model_copy(update={"telemetry": telemetry}))
        # Started before the streams are there (``busscrape run`` applies them meanwhile): they wait.
        extra = ["--wait-streams", str(wait_streams)] if wait_streams else []
        self.daemons = [Daemon(f"worker-{i + 1}", ["worker", *extra]) for i in range(workers)]
        self.daemons += [Daemon(f"ingester-{i + 1}", ["ingester", *extra]) for i in range(ingesters)]
        self._starting: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.pids = PidFiles(settings.state_dir)
        self._lifeline: Lifeline | None = None

    async def __aenter__(self) -> Daemons:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lifeline = Lifeline()
        # In a task: a fork waits for the fork server's imports, and the caller goes on meanwhile
        # (``busscrape run`` starts its server; the daemons wait for the streams).
        self._starting = asyncio.create_task(self._start_all())
        self._watch = asyncio.create_task(self._supervise())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _start_all(self) -> None:
        for daemon in self.daemons:
            await self._start(daemon)

    async def _start(self, daemon: Daemon) -> None:
        try:
            await self._launch(daemon)
        except (OSError, EOFError) as exc:  # no process (executable gone, no pids left, the fork server died)
            daemon.process = None
            log.error("daemon.not_started", daemon=daemon.name, error=str(exc))
            self._fatal(EXIT_PARTIAL, f"{daemon.name} could not be started: {exc}")

    async def _launch(self, daemon: Daemon) -> None:
        daemon.log_path = self.log_dir / f"{daemon.name}.log"
        env = {**self.env, "BUSSCRAPE_WORKER__NAME": daemon.name, "BUSSCRAPE_INGESTER__NAME": daemon.name}
        assert self._lifeline is not None
        fd = self._lifeline.read_fd
        if forks.started():  # the command line's: a fork of its warm fork server (ops.forks)
            daemon.process = await asyncio.to_thread(forks.start, daemon.args, env, daemon.log_path, fd)
        else:
            daemon.process = _spawn(daemon, env, fd)
        self.pids.record(daemon.name, daemon.process.pid)
        log.info("daemon.started", daemon=daemon.name, pid=daemon.process.pid, log=str(daemon.log_path))

    async def _supervise(self) -> None:
        assert self._starting is not None
        await self._starting
        while not self._stopping:
            await asyncio.sleep(1)
            for daemon in self.daemons:
                proc = daemon.process
                if self._stopping or proc is None or proc.poll() is None:
                    continue
                if proc.returncode in (2, 3):
                    # Configuration errors repeat on restart: say so once and leave it down.
                    log.error("daemon.exited", daemon=daemon.name, code=proc.returncode, log=str(daemon.log_path))
                    daemon.process = None
                    self._fatal(proc.returncode, f"{daemon.name} exited with a configuration error: "
                                                 f"{last_error(daemon.log_path)} (log: {daemon.log_path})")
                    continue
                if daemon.restarts >= MAX_RESTARTS:
                    log.error("daemon.gave_up", daemon=daemon.name, restarts=daemon.restarts)
                    daemon.process = None
                    if not any(d.process for d in self.daemons if d.name.startswith("worker-")):
                        self._fatal(EXIT_PARTIAL, f"no worker left alive: {daemon.name} exited {daemon.restarts + 1} "
                                                  f"times (last code {proc.returncode}; log: {daemon.log_path})")
                    continue
                daemon.restarts += 1
                log.warning("daemon.restarting", daemon=daemon.name, code=proc.returncode, restarts=daemon.restarts)
                await self._start(daemon)

    def _fatal(self, code: int, message: str) -> None:
        if self.on_fatal is not None and not self._fatal_said:
            self._fatal_said = True
            self.on_fatal(code, message)

    def failed(self) -> list[str]:
        """Daemons that are down for good (with the log to read)."""
        return [f"{d.name} (see {d.log_path})" for d in self.daemons if d.process is None]

    async def stop(self, grace: float | None = None) -> None:
        """SIGTERM every daemon and let them drain for ``grace``; a second SIGTERM then hands
        their in-flight work back at once; SIGKILL what is still there after that."""
        if self._stopping:
            return
        self._stopping = True
        if self._starting is not None:
            await self._starting  # a daemon being started is stopped like the others, not left behind
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        running = [d.process for d in self.daemons if d.process and d.process.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        grace = grace if grace is not None else self.settings.worker.grace_period
        await _wait_all(running, grace)
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        await _wait_all(running, 15)
        for proc in running:
            if proc.poll() is None:
                proc.kill()
        await _wait_all(running, 10)
        for daemon in self.daemons:
            self.pids.remove(daemon.name)
        if self._lifeline is not None:
            self._lifeline.close()
        log.info("daemons.stopped", count=len(running))


def _spawn(daemon: Daemon, env: dict[str, str], lifeline_fd: int) -> subprocess.Popen[bytes]:
    """A fresh interpreter: ``python -m busscrape *args --lifeline FD``. Called from the event loop's
    thread only: the parent-death signal follows the forking thread."""
    with open(daemon.log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "busscrape", *daemon.args, "--lifeline", str(lifeline_fd)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(lifeline_fd,), preexec_fn=die_with_parent())


async def _wait_all(procs: list[subprocess.Popen[bytes] | forks.Forked], seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    for proc in procs:
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, remaining)


def last_error(log_path: Path, tail: int = 8192) -> str:
    """The ``error:`` message a daemon printed last in its log (``cli.app``: a configuration
    error is one such message, maybe wrapped over lines), or a pointer to the log."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    at = text.rfind("error: ")
    if at < 0:
        return "(see its log)"
    lines = text[at + len("error: "):].splitlines()
    said = [lines[0], *itertools.takewhile(lambda line: not line.startswith("{"), lines[1:])]
    return " ".join(part.strip() for part in said)
