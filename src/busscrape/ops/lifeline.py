"""Children of ``busscrape run`` that die with it, and what a run killed outright leaves behind.

The daemons and the embedded nats-server run in their own sessions (a Ctrl-C at the terminal
goes to ``run``, which stops them in order), so nothing stops them when ``run`` itself is
SIGKILLed or crashes. Three layers:

- **Parent-death signal** (Linux): each child asks the kernel for SIGTERM when its parent goes
  (``prctl(PR_SET_PDEATHSIG)``, set between fork and exec). The signal follows the *thread* that
  forked, so children are started from the event loop's thread, never from a worker thread.
  (The command line's daemons are forks of a fork server that outlives them, ``ops.forks``:
  they keep the other two layers.)
- **Lifeline** (everywhere, busscrape daemons only): the parent holds the write end of a pipe, the
  child watches the read end (``--lifeline FD``). When the parent dies the kernel closes its end
  and the child reads end-of-file: it stops, handing its tasks back.
- **Pid files** (``<state_dir>/pids/<name>.json``: pid, start time, the parent's pid and start
  time): the next ``run`` on the state dir stops what an earlier one left (its parent gone), and
  refuses to start beside a run that is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import structlog

from busscrape.errors import ConfigurationError

log = structlog.get_logger("busscrape.lifeline")

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks for SIGTERM when the parent dies (Linux), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Lifeline:
    """The parent's end: a pipe whose read end each child inherits. Close it to let them go."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_inheritable(self.read_fd, True)

    def close(self) -> None:
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def watch(fd: int, gone: Callable[[], None]) -> Callable[[], None]:
    """Child side: call ``gone`` once when the parent's end of the lifeline closes. Returns the
    function that stops watching."""
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            log.warning("daemon.parent_gone")
            gone()

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)

    def stop() -> None:
        with contextlib.suppress(Exception):
            loop.remove_reader(fd)

    return stop


def _started(pid: int) -> float | None:
    """When ``pid`` started (clock ticks since boot on Linux), or None when it is not running.
    Pid and start time together name one process: a reused pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        stat = ""
    if stat:
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie has exited
            return None
        return float(fields[19])
    try:  # no /proc (macOS): alive or not, without a start time
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return 0.0


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    return _started(pid) is not None


class PidFiles:
    """The processes one run started, under ``<state_dir>/pids``."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "pids"
        self.left: list[str] = []
        """What ``stop_leftovers`` found of an earlier run (alive or not): that run did not end cleanly."""

    def record(self, name: str, pid: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        doc = {"name": name, "pid": pid, "started": _started(pid), "parent": me, "parent_started": _started(me)}
        tmp = self.dir / f".{name}.json.tmp"
        tmp.write_bytes(orjson.dumps(doc))
        tmp.replace(self.dir / f"{name}.json")

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{name}.json").unlink()

    def stop_leftovers(self, timeout: float = 15.0) -> list[str]:
        """Stop every process an earlier run left running (its run gone); refuse (exit 2) while
        that run is alive. Returns the names of what was stopped."""
        alive: list[tuple[str, int]] = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                doc = orjson.loads(path.read_bytes())
                name, pid, parent = str(doc["name"]), int(doc["pid"]), int(doc["parent"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if parent != os.getpid() and doc.get("parent_started") is not None \
                    and _started(parent) == doc["parent_started"]:
                raise ConfigurationError(
                    f"another busscrape run (pid {parent}) is using {self.dir.parent}: wait for it to finish, "
                    "stop it, or give this one another BUSSCRAPE_STATE_DIR")
            self.left.append(name)
            if doc.get("started") is not None and _started(pid) == doc["started"]:
                alive.append((name, pid))
            else:
                path.unlink(missing_ok=True)
        for name, pid in alive:
            log.warning("run.leftover", name=name, pid=pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_started(pid) is not None for _, pid in alive) and time.monotonic() < deadline:
            time.sleep(0.1)
        for name, pid in alive:
            if _started(pid) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.remove(name)
        return [name for name, _ in alive]
