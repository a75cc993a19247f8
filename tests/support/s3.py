"""A real S3-protocol server on loopback: MinIO in Docker when an engine answers, else moto.

Either way clients reach it through a ``TcpProxy``, so a test can take the endpoint down
(connection refused) and bring it back with every stored object intact.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from .net import TcpProxy, free_port, wait_port

ACCESS_KEY = "busscrape-test"
SECRET_KEY = "busscrape-test-secret-key"


def docker_available() -> bool:
    docker = shutil.which("docker")
    if not docker:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class S3Server:
    """Start with ``start()``, stop with ``stop()``; ``outage()``/``restore()`` toggle the endpoint."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.kind = "minio" if docker_available() else "moto"
        self._process: subprocess.Popen[bytes] | None = None
        self._container = None
        self.proxy: TcpProxy | None = None
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY

    def start(self) -> S3Server:
        if self.kind == "minio":
            from testcontainers.core.container import DockerContainer

            self._container = (
                DockerContainer("minio/minio:latest")
                .with_env("MINIO_ROOT_USER", ACCESS_KEY)
                .with_env("MINIO_ROOT_PASSWORD", SECRET_KEY)
                .with_command("server /data")
                .with_exposed_ports(9000)
            )
            self._container.start()
            host, port = "127.0.0.1", int(self._container.get_exposed_port(9000))
        else:
            host, port = "127.0.0.1", free_port()
            moto = Path(sys.executable).parent / "moto_server"
            log = open(self.workdir / "moto.log", "ab")
            self._process = subprocess.Popen([str(moto), "-H", host, "-p", str(port)], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        wait_port(host, port, timeout=60)
        self.proxy = TcpProxy(host, port)
        self.proxy.up()
        return self

    @property
    def endpoint(self) -> str:
        assert self.proxy is not None
        return f"{self.proxy.host}:{self.proxy.port}"

    def outage(self) -> None:
        """Refuse connections (the stored objects survive)."""
        assert self.proxy is not None
        self.proxy.down()

    def restore(self) -> None:
        assert self.proxy is not None
        self.proxy.up()

    def stop(self) -> None:
        if self.proxy:
            self.proxy.close()
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._container is not None:
            self._container.stop()

    def settings(self, bucket: str) -> dict[str, object]:
        """The ``s3`` settings section that points at this server."""
        return {"endpoint": self.endpoint, "access_key": self.access_key, "secret_key": self.secret_key,
                "bucket": bucket, "secure": False}


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)
