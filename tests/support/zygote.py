"""A warm interpreter the tests fork ``busscrape`` commands from (tests/support/cli.py).

The suite runs a few hundred short commands (``status``, ``dlq``, ``dispatch``, ``config`` …) as a
user would, each a process of its own. Most of a command's CPU is its imports (~0.5 s: pydantic
settings, nats-py and aiohttp, rich, structlog), so on two cores they cost minutes of the suite.
The zygote imports them once, per test process; each command is then a ``fork`` of it that sets
its own argv, environment, working directory and stdio, runs the real entry point (busscrape's
``__main__``, through runpy) and exits with its code, as ``python -m busscrape`` would: a real
process with its own state, only its imports already done.

The daemons the tests start themselves (``tests/support/procs.py``'s ``spawn``) and the ``run`` and
``crawl`` commands they watch while they run (``tests/e2e/test_run.py``'s ``cli``) are forked the
same way, through ``Zygote.popen``: a handle with the part of ``subprocess.Popen`` the tests use
(pid, poll, wait, signals, communicate), in a session of their own as ``start_new_session`` gives.
A fresh daemon imports Typer, pydantic, nats-py and Playwright again: forked, ~0.3 s of CPU less
each (measured on 37 daemon-heavy tests, docs/development.md).

What a forked command cannot show, the fresh interpreter still runs: a test that sets a
``PYTHON*`` variable (a module blocked on ``PYTHONPATH``) starts ``python -m busscrape``;
``BUSSCRAPE_TEST_FRESH_COMMANDS=1`` runs every command and daemon that way.

Protocol (one Unix-socket connection per command): the test sends one JSON line (args, env, cwd,
the paths of the stdin, stdout and stderr files, whether output appends and whether the child
gets a session of its own); the zygote answers the child's pid, then its exit status as
``subprocess`` reports it (negative: the signal that ended it).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.environment import AT_START

# What the commands import before they do anything (imported lazily inside each command), and
# what the daemons import (as the product's own fork server preloads them: busscrape.ops.forks).
PRELOAD = (
    "busscrape.cli", "busscrape.settings", "busscrape.telemetry.logs", "busscrape.bus.connection",
    "busscrape.bus.provision", "busscrape.ops.overview", "busscrape.deadletters.queue",
    "busscrape.dispatch.dispatcher", "busscrape.crawl.state", "rich.console", "rich.table",
    "busscrape.cli.worker", "busscrape.cli.ingester", "busscrape.worker.browser.driver",
    "busscrape.worker.daemon", "busscrape.ingest.daemon",
)


def _child(request: dict[str, object], started: int) -> None:
    """In the forked child: become the command, run it, exit with its code. Never returns.
    ``started`` is closed once the child is in its session, as Popen returns only then."""
    code: int = 1
    try:
        if request.get("session"):
            os.setsid()  # as start_new_session=True: a group of its own, out of the terminal's signals
        os.close(started)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        written = os.O_WRONLY | (os.O_APPEND | os.O_CREAT if request.get("append") else 0)
        for fd, key, flags in ((0, "stdin", os.O_RDONLY), (1, "stdout", written), (2, "stderr", written)):
            if key == "stderr" and request["stderr"] == request["stdout"]:
                os.dup2(1, 2)  # as stderr=STDOUT: one file, one offset
                continue
            opened = os.open(str(request[key]), flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        # As a fresh interpreter off a terminal: UTF-8 files, stdout strict, stderr backslashreplace;
        # with PYTHONUNBUFFERED, written through (a daemon's log is read while it runs).
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict",
                                      write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True, write_through=unbuffered)
        args = request["args"]
        assert isinstance(args, list)
        sys.argv = ["busscrape", *args]
        try:
            # As `python -m busscrape`: __main__ is busscrape/__main__.py, argv[0] its path.
            runpy.run_module("busscrape", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:  # as the interpreter does: end by SIGINT itself
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # as the interpreter does: the traceback, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


_FORKING = threading.Lock()


def _serve_one(conn: socket.socket) -> None:
    with conn, conn.makefile("rwb") as channel:
        request = json.loads(channel.readline())
        # One fork at a time while the pipe's write end is open here: a child forked beside it would
        # hold a copy, and the end of file would wait for that child to end.
        with _FORKING:
            started, child_started = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(started)
                _child(request, child_started)
            os.close(child_started)
        os.read(started, 1)  # end of file: the child is in its session (or gone)
        os.close(started)
        with contextlib.suppress(OSError):  # the test gave up on it (its timeout)
            channel.write(f"{pid}\n".encode())
            channel.flush()
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        with contextlib.suppress(OSError):
            channel.write(f"{code}\n".encode())
            channel.flush()


def serve(path: str) -> None:
    """The zygote's main: preload, then fork a command per connection until stdin closes."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    # The test process holds our stdin: when it ends (even killed), so do we.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


class Zygote:
    """The test process's handle on its zygote, started at the first command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        # Made at the first command, not at import: the zygote imports this module too, and every
        # process it forks runs its exit handlers.
        self._dir: Path | None = None
        self._socket = ""

    def _start(self) -> Path:
        """The zygote running (started if need be); returns this process's folder for it."""
        with self._lock:
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="busscrape-zygote-"))
                self._socket = str(self._dir / "s")
                atexit.register(self.close)  # its folder goes at exit
            if self._process is not None and self._process.poll() is None:
                return self._dir
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket)
            root = str(Path(__file__).resolve().parents[2])
            env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
            self._process = subprocess.Popen(
                [sys.executable, "-c", f"from tests.support.zygote import serve; serve({self._socket!r})"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root, env=env)
            assert self._process.stdout is not None
            if self._process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the test zygote did not start (exit {self._process.wait(30)})")
            return self._dir

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    @staticmethod
    def can_run(env: dict[str, str]) -> bool:
        """Whether a forked command would start as a fresh one with ``env``: the interpreter
        reads its PYTHON* variables only at start, so a test that sets its own needs a fresh one."""
        # As the run was started: the suite takes BUSSCRAPE_* out of its own environment.
        if AT_START.get("BUSSCRAPE_TEST_FRESH_COMMANDS", "") not in ("", "0"):
            return False
        ours = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
        return {k: v for k, v in env.items() if k.startswith("PYTHON")} == ours

    def run(self, args: list[str], env: dict[str, str], cwd: Path | None, stdin: str | bytes | None,
            timeout: float, text: bool = True) -> subprocess.CompletedProcess[Any]:
        folder = self._start()
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            paths = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_bytes(stdin.encode() if isinstance(stdin, str) else stdin or b"")
            for name in ("stdout", "stderr"):
                paths[name].touch()
            request = {"args": args, "env": env, "cwd": str(cwd or os.getcwd()),
                       **{name: str(path) for name, path in paths.items()}}
            conn, channel = self._send(request)
            conn.settimeout(timeout)
            with conn, channel:
                pid = int(channel.readline())
                try:
                    code = int(channel.readline())
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(["busscrape", *args], timeout) from None
            out, err = (paths[name].read_bytes() for name in ("stdout", "stderr"))
        if text:
            return subprocess.CompletedProcess(["busscrape", *args], code, out.decode(errors="replace"),
                                               err.decode(errors="replace"))
        return subprocess.CompletedProcess(["busscrape", *args], code, out, err)

    def popen(self, args: list[str], env: dict[str, str], cwd: Path | None = None, log: Path | None = None,
              text: bool = True) -> Forked:
        """``python -m busscrape ARGS`` started and left running, as ``subprocess.Popen`` with
        ``start_new_session=True`` and stderr into stdout would: its output appended to ``log``, or
        kept for ``communicate`` when there is none; stdin from /dev/null."""
        folder = self._start()
        capture = None
        if log is None:
            capture = log = Path(tempfile.mkdtemp(dir=folder)) / "output"
        request = {"args": args, "env": env, "cwd": str(cwd or os.getcwd()), "stdin": os.devnull,
                   "stdout": str(log), "stderr": str(log), "append": True, "session": True}
        return Forked(["busscrape", *args], *self._send(request), capture, text)

    def _send(self, request: dict[str, object]) -> tuple[socket.socket, Any]:
        """One request to the zygote: the connection and its channel, for the pid and the exit status."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._socket)
        channel = conn.makefile("rwb")
        channel.write(json.dumps(request).encode() + b"\n")
        channel.flush()
        return conn, channel


class Forked:
    """A process the zygote forked and reaps, with the part of ``subprocess.Popen`` the tests use.
    Its exit status arrives from the zygote on the request's connection (read by a thread here):
    ``poll`` and ``returncode`` show it once it has, ``wait`` waits for it."""

    stdin = stdout = stderr = None

    def __init__(self, args: list[str], conn: socket.socket, channel: Any, capture: Path | None,
                 text: bool) -> None:
        self.args = args
        self.pid = int(channel.readline())
        self.returncode: int | None = None
        self._capture = capture
        self._text = text
        self._ended = threading.Event()
        threading.Thread(target=self._reap, args=(conn, channel), daemon=True).start()

    def _reap(self, conn: socket.socket, channel: Any) -> None:
        try:
            with conn, channel:
                line = channel.readline()
                if line:  # nothing: the zygote itself ended (the test process is exiting)
                    self.returncode = int(line)
        finally:
            self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        if self.returncode is None:
            raise RuntimeError(f"the test zygote ended before {self.args} did (pid {self.pid})")
        return self.returncode

    def communicate(self, input: None = None, timeout: float | None = None) -> tuple[Any, None]:
        """Waits as ``Popen.communicate`` does; the output (stdout and stderr together), when it
        was kept rather than logged."""
        self.wait(timeout)
        if self._capture is None:
            return None, None
        out = self._capture.read_bytes()
        shutil.rmtree(self._capture.parent, ignore_errors=True)
        self._capture = None
        return (out.decode(errors="replace") if self._text else out), None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # as Popen's: not once its end is known (its pid may be reused)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


ZYGOTE = Zygote()
