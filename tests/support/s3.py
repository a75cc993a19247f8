"""A real S3-protocol server on loopback: MinIO in Docker when an engine answers, else moto.

Either way clients reach it through a ``TcpProxy``, so a test can take the endpoint down
(connection refused) and bring it back with every stored object intact. With ``tls`` (a
certificate and key, e.g. from ``support.pki``) it is moto serving HTTPS: the proxy forwards
raw TCP, so TLS passes through it end to end.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.net import ProxiedServer, TcpProxy, free_port, wait_port
from tests.support.pki import Issued

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


class S3Server(ProxiedServer):
    """Start with ``start()``, stop with ``stop()``; ``outage()``/``restore()`` toggle the endpoint."""

    def __init__(self, workdir: Path, *, tls: Issued | None = None, check_credentials: bool = False) -> None:
        self.workdir = workdir
        self.tls = tls
        # moto accepts any key unless told otherwise; checked, only a key it issued is accepted.
        self.check_credentials = check_credentials
        self.kind = "minio" if tls is None and not check_credentials and docker_available() else "moto"
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
            args = [str(moto), "-H", host, "-p", str(port)]
            if self.tls is not None:
                args += ["--ssl-cert", str(self.tls.cert), "--ssl-key", str(self.tls.key)]
            log = open(self.workdir / "moto.log", "ab")
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        wait_port(host, port, timeout=60)
        self.proxy = TcpProxy(host, port)
        self.proxy.up()
        if self.check_credentials:
            self._require_credentials()
        return self

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def _require_credentials(self) -> None:
        """moto: an IAM user allowed everything, its key pair as ours, then every request checked."""
        import json

        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup", verify=str(self.tls.ca) if self.tls else None)
        iam.create_user(UserName="busscrape")
        iam.put_user_policy(UserName="busscrape", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="busscrape")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        self.unchecked(0)

    def unchecked(self, count: int) -> None:
        """moto: let the next ``count`` requests through unchecked, then check every one. (moto
        cannot check an unsigned STS AssumeRoleWithWebIdentity: it wants a signature on it.)"""
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.tls.ca)) if self.tls else None
        request = urllib.request.Request(f"{self.url}/moto-api/reset-auth", data=str(count).encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            response.read()

    @property
    def endpoint(self) -> str:
        assert self.proxy is not None
        return f"{self.proxy.host}:{self.proxy.port}"

    def stop(self) -> None:
        super().stop()
        if self._container is not None:
            self._container.stop()

    def settings(self, bucket: str) -> dict[str, object]:
        """The ``s3`` settings section that points at this server."""
        return {"endpoint": self.endpoint, "access_key": self.access_key, "secret_key": self.secret_key,
                "bucket": bucket, "secure": self.tls is not None}


def bucket_exists(server: S3Server, bucket: str) -> bool:
    """Whether the server holds ``bucket`` (asked with botocore, not through the code under test)."""
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key, verify=str(server.tls.ca) if server.tls else None)
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        return False
    return True


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
