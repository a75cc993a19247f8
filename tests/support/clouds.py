"""Azure Blob and Google Cloud Storage servers on loopback: Azurite and gcp-storage-emulator.

Azurite is npm's (``scripts/bootstrap.sh test`` installs it under ``.tools/``, or any
``azurite-blob`` on PATH); gcp-storage-emulator is the test extra's. Each is reached through a
``TcpProxy`` so a test can take the endpoint down (connection refused) and bring it back with
every stored object intact, and each hands out the standard environment its cloud's clients
read (``AZURE_STORAGE_CONNECTION_STRING``, ``STORAGE_EMULATOR_HOST``).

Missing, the tests that need them are skipped on a developer's machine, and fail in CI (``CI``
or ``BUSSCRAPE_REQUIRE_EMULATORS`` set), where a skip would pass without having run them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.net import ProxiedServer, TcpProxy, free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]
# Azurite's well-known development account (public, in Microsoft's documentation).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> str | None:
    local = ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


def unavailable(what: str, env: dict[str, str]) -> None:
    """Skip a test whose emulator is not installed, or fail it when this run requires them."""
    if any(env.get(name, "").lower() not in ("", "0", "false", "no") for name in ("CI", "BUSSCRAPE_REQUIRE_EMULATORS")):
        pytest.fail(f"{what} is required in this run (CI or BUSSCRAPE_REQUIRE_EMULATORS); scripts/bootstrap.sh test "
                    "installs it", pytrace=False)
    pytest.skip(f"{what} is not installed (scripts/bootstrap.sh test installs it)")


class _Emulator(ProxiedServer):
    """An emulator process behind a ``TcpProxy``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> _Emulator:
        log = open(self.workdir / "emulator.log", "ab")
        self._process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.workdir)
        log.close()
        wait_port("127.0.0.1", self.port, timeout=60)
        self.proxy = TcpProxy("127.0.0.1", self.port)
        self.proxy.up()
        return self

    @property
    def endpoint(self) -> str:
        assert self.proxy is not None
        return f"http://{self.proxy.host}:{self.proxy.port}"

    def env(self) -> dict[str, str]:
        """The standard environment its cloud's clients read to reach it."""
        raise NotImplementedError


class Azurite(_Emulator):
    """Azurite's blob service, its data in ``workdir``."""

    # On SIGTERM Azurite waits for its clients' keep-alive connections to close, 10 s after the
    # outage tests; its data is this session's alone, so it need not end gracefully.
    stop_grace = 1.0

    def command(self) -> list[str]:
        binary = azurite_binary()
        assert binary is not None
        return [binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(self.workdir),
                "--silent", "--skipApiVersionCheck"]

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING":
                f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                f"BlobEndpoint={self.endpoint}/{AZURE_ACCOUNT};"}

    def create_container(self, name: str) -> None:
        """With Azure's own SDK, not through the code under test."""
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(self.env()["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)


class GcsEmulator(_Emulator):
    """gcp-storage-emulator, in memory."""

    def command(self) -> list[str]:
        emulator = Path(sys.executable).parent / "gcp-storage-emulator"
        return [str(emulator), "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory"]

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, name: str) -> None:
        """Through the JSON API, not through the code under test."""
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
