"""A real PostgreSQL server on loopback, from Debian's packages, in a temporary data folder.

``initdb`` then ``postgres`` on a free port of 127.0.0.1 with password (scram) authentication and
no Unix socket. PostgreSQL refuses to run as root, so as root (CI) both run as the ``postgres``
user the Debian package creates, through ``runuser``; the data folder is made under /tmp (not
pytest's root-only temp folder) and handed to that user. ``skip_reason()`` says why it cannot
run here, for the one case where that is honest: no PostgreSQL installed (scripts/bootstrap.sh
installs it for the test command). In CI (``CI`` set, or ``BUSSCRAPE_REQUIRE_POSTGRES``, which
``make test`` sets) that is a failure instead (``unavailable``): a suite that skips its
PostgreSQL tests there would pass without having run them.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.net import free_port, wait_port

USER = "busscrape"
PASSWORD = "busscrape-test-password"
RUN_AS = "postgres"  # the system user of Debian's postgresql package


def binaries() -> Path | None:
    """The folder holding initdb and postgres: on PATH, else Debian's versioned folder (newest)."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(os.path.realpath(found)).parent
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    return Path(folders[-1]) if folders else None


def skip_reason() -> str | None:
    if binaries() is None:
        return "PostgreSQL is not installed (apt-get install postgresql; scripts/bootstrap.sh test does it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no {RUN_AS!r} user to run PostgreSQL as"
        if not shutil.which("runuser"):
            return "running as root without runuser to drop privileges for PostgreSQL"
    return None


def required(env: dict[str, str]) -> bool:
    """Whether this run must have PostgreSQL (CI, or ``BUSSCRAPE_REQUIRE_POSTGRES``)."""
    return any(env.get(name, "").lower() not in ("", "0", "false", "no")
               for name in ("CI", "BUSSCRAPE_REQUIRE_POSTGRES"))


def unavailable(reason: str, env: dict[str, str]) -> None:
    """Skip the tests that need PostgreSQL, or fail them when this run requires it."""
    if required(env):
        pytest.fail(f"PostgreSQL is required in this run (CI or BUSSCRAPE_REQUIRE_POSTGRES) but: {reason}",
                    pytrace=False)
    pytest.skip(reason)


class PostgresServer:
    """``start()`` / ``stop()``; ``dsn(database)`` for clients, ``admin_dsn`` for the ``postgres`` database."""

    def __init__(self) -> None:
        self.bin = binaries()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="busscrape-pg-"))
        self.data = self.root / "data"
        self._process: subprocess.Popen[bytes] | None = None

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv

    def start(self) -> PostgresServer:
        assert self.bin is not None, skip_reason()
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            user = pwd.getpwnam(RUN_AS)
            for path in (self.root, pwfile):
                os.chown(path, user.pw_uid, user.pw_gid)
        subprocess.run(self._as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "--pwfile",
                                       str(pwfile), "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
                                       "--no-sync"]),
                       check=True, capture_output=True, timeout=120)
        log = open(self.root / "postgres.log", "ab")
        try:
            self._process = subprocess.Popen(
                self._as_owner([str(self.bin / "postgres"), "-D", str(self.data), "-c", "listen_addresses=127.0.0.1",
                                "-c", f"port={self.port}", "-c", "unix_socket_directories=", "-c", "fsync=off",
                                "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        try:
            wait_port("127.0.0.1", self.port, timeout=60)
        except TimeoutError:
            raise RuntimeError(f"PostgreSQL did not start: {self.log()[-2000:]}") from None
        time.sleep(0.2)  # it listens a moment before it accepts logins
        return self

    def log(self) -> str:
        path = self.root / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def dsn(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    @property
    def admin_dsn(self) -> str:
        return self.dsn("postgres")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()  # SIGTERM: PostgreSQL's "smart" shutdown
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
