"""Daemons forked from a warm interpreter: the command line's workers and ingesters start
without importing.

A daemon started as ``python -m busscrape worker`` spends its first ~0.5 s of CPU (more on two busy
cores) importing what every daemon imports: Typer, the settings' pydantic models, nats-py,
Playwright, structlog, the worker and the ingester. On a cold ``busscrape run`` that sat on the way
to the first page, beside the run's own start, the embedded server and Chromium. So ``run``,
``crawl`` and ``demo`` start the standard library's fork server (``multiprocessing``'s
``forkserver``) as their first step (``busscrape.entry``, before the command line loads): it
imports ``PRELOAD`` while the command builds its settings and starts NATS, and each daemon is then
a fork of it — a process of its own, in a session of its own, with the environment, argv and log
file the supervisor gives it, running the entry point ``python -m busscrape`` runs
(``busscrape.cli.main``). First page archived: 1.75 s → 1.42 s (``bench/cold_start.py``,
docs/performance.md).

Only the command line forks: the fork server's children re-run the parent's ``__main__`` module
(``multiprocessing``'s rule), which is busscrape's own entry point there but would be a user's
script under the Python API, whose daemons stay fresh interpreters (``ops.supervisor``).

Of ``ops.lifeline``'s layers the forked daemons keep the lifeline (the run's pipe reaches the fork
through the server) and the pid files. The parent-death signal would be relative to the fork
server, which lives as long as its children, so it is not asked for: the lifeline is what stops a
daemon whose run was killed outright (``tests/e2e/test_run.py``).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing import reduction
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import setproctitle

PRELOAD = (
    "busscrape.cli", "busscrape.cli.worker", "busscrape.cli.ingester", "busscrape.settings", "structlog",
    "busscrape.telemetry.logs", "busscrape.bus.connection", "busscrape.bus.provision",
    "busscrape.worker.browser.driver", "busscrape.worker.daemon", "busscrape.ingest.daemon",
)
"""What the daemons import before their first task (none of it starts a thread on import: the
fork server must stay single-threaded to fork safely)."""

_context = multiprocessing.get_context("forkserver")
_started = False


def prestart() -> None:
    """Start the fork server now (once), so that its imports overlap what the command does next;
    from then on ``ops.supervisor`` forks this process's daemons off it."""
    global _started
    if not _started:
        _context.set_forkserver_preload(list(PRELOAD))
        multiprocessing.forkserver.ensure_running()
        _started = True


def started() -> bool:
    return _started


class Forked:
    """A forked daemon, with the part of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process
        self.pid: int = process.pid or 0

    @property
    def returncode(self) -> int | None:
        """As ``Popen``'s: the exit code, or minus the signal that ended it; None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(["busscrape"], timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:  # not reaped yet, so the pid is still this process's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args: list[str], env: Mapping[str, str], log_path: Path, lifeline_fd: int) -> Forked:
    """Fork ``busscrape *args --lifeline FD`` off the fork server, its output appended to ``log_path``.
    Blocks until the server has forked it (the first call: until the server's imports are done).
    The log is opened here, so that a log that cannot be opened is this caller's ``OSError``, as
    with ``subprocess``, and not a traceback on the fork server's terminal."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        # Not "daemonic" in multiprocessing's sense, which would forbid it processes of its own (the
        # extractors' pool); the supervisor stops it before this process ends.
        process = _context.Process(target=_main, args=(args, dict(env), _Fd(log), _Fd(lifeline_fd)))
        process.start()
    finally:
        os.close(log)
    return Forked(process)


class _Fd:
    """An open file descriptor handed to the fork: duplicated into it through the fork server
    (``multiprocessing.reduction.DupFd``, as multiprocessing passes its own pipes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return _Fd._arrived, (reduction.DupFd(self.fd),)

    @staticmethod
    def _arrived(dup: Any) -> _Fd:
        return _Fd(dup.detach())


def _main(args: list[str], env: dict[str, str], log: _Fd, lifeline: _Fd) -> None:
    """In the fork: become ``python -m busscrape *args --lifeline FD``, as ``subprocess`` would start it."""
    os.setsid()  # a session of its own: a Ctrl-C at the terminal is the run's to hand on
    os.dup2(log.fd, 1)
    os.dup2(log.fd, 2)
    os.close(log.fd)
    sys.argv = ["busscrape", *args, "--lifeline", str(lifeline.fd)]
    # What ps and top show: its own command, not the fork server's. Before the environment is
    # replaced: setproctitle finds the process's argv area through the original environment.
    setproctitle.setproctitle(" ".join(sys.argv))
    os.environ.clear()
    os.environ.update(env)
    from busscrape.cli import main

    try:
        main()
    finally:
        # multiprocessing ends its children with os._exit, past the atexit handlers a command
        # registers (cli.app: the state dir's server); run them as an interpreter's exit would.
        atexit._run_exitfuncs()
