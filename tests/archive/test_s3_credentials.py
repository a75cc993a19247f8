"""S3 credentials from AWS's own chain, resolved by botocore, against moto checking every request.

No ``BUSSCRAPE_S3__*`` keys here: the archive location is ``s3://bucket/prefix`` and the endpoint
``AWS_ENDPOINT_URL`` (or the profile's ``endpoint_url``), as a pod on EKS, a developer with a
profile or an EC2 instance (its metadata service here a small server on 127.0.0.2) has them. moto
accepts only keys it issued (its IAM user's, or temporary ones from its STS), so a request that
passes was signed with the credentials the chain was meant to find.
"""

import http.server
import json
import threading
import uuid
from typing import ClassVar

import boto3
import pytest

from busscrape.archive.storage import open_storage
from busscrape.archive.storage.s3 import S3Storage
from busscrape.errors import AuthenticationFailed, ConfigurationError
from busscrape.settings import Settings
from tests.support.s3 import S3Server

ACCOUNT = "123456789012"  # moto's default account
ROLE = f"arn:aws:iam::{ACCOUNT}:role/archiver"


@pytest.fixture(scope="module")
def checked_s3(tmp_path_factory):
    """moto checking credentials, with a role the web-identity path can assume."""
    server = S3Server(tmp_path_factory.mktemp("checked-s3"), check_credentials=True).start()
    iam = aws(server, "iam")
    iam.create_role(RoleName="archiver", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Federated": "oidc"}, "Action": "sts:AssumeRoleWithWebIdentity"}]}))
    iam.put_role_policy(RoleName="archiver", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    yield server
    server.stop()


def aws(server: S3Server, service: str, **keys):
    """A boto3 client of the test's own (not the code under test's), with the IAM user's key by default."""
    keys = keys or {"aws_access_key_id": server.access_key, "aws_secret_access_key": server.secret_key}
    return boto3.client(service, endpoint_url=server.url, region_name="us-east-1", **keys)


@pytest.fixture
def aws_env(monkeypatch, tmp_path, checked_s3):
    """A clean AWS environment (no profile files, no metadata) that points at moto."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", checked_s3.url)
    return monkeypatch


async def round_trip(store) -> None:
    async with store:
        await store.put_bytes("dt=2025-01-01/x/meta.json", b"{}\n", content_type="application/json")
        assert await store.get("dt=2025-01-01/x/meta.json") == b"{}\n"
        assert await store.keys() == ["dt=2025-01-01/x/meta.json"]


def location() -> str:
    return f"s3://c-{uuid.uuid4().hex[:10]}/runs"


@pytest.mark.s3
async def test_keys_with_a_session_token_from_the_environment(aws_env, checked_s3):
    # Temporary credentials (key, secret and session token), as `aws sts assume-role…` prints them.
    checked_s3.unchecked(1)  # (moto cannot check the unsigned STS call)
    temporary = aws(checked_s3, "sts").assume_role_with_web_identity(
        RoleArn=ROLE, RoleSessionName="by-hand", WebIdentityToken="token")["Credentials"]
    aws_env.setenv("AWS_ACCESS_KEY_ID", temporary["AccessKeyId"])
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", temporary["SecretAccessKey"])
    aws_env.setenv("AWS_SESSION_TOKEN", temporary["SessionToken"])
    store = open_storage(Settings(), location())
    await round_trip(store)
    assert store.provider().get("token") == temporary["SessionToken"]


@pytest.mark.s3
async def test_a_profile_from_the_aws_config_files(aws_env, checked_s3, tmp_path):
    aws_env.delenv("AWS_ENDPOINT_URL")  # the profile says where S3 is, as `aws configure` lets it
    (tmp_path / "aws-config").write_text(f"[profile archiver]\nregion = eu-west-1\nendpoint_url = {checked_s3.url}\n")
    (tmp_path / "aws-credentials").write_text(
        f"[archiver]\naws_access_key_id = {checked_s3.access_key}\naws_secret_access_key = {checked_s3.secret_key}\n")
    aws_env.setenv("AWS_PROFILE", "archiver")
    store = open_storage(Settings(), location())
    await round_trip(store)
    assert store.provider()["access_key_id"] == checked_s3.access_key


@pytest.mark.s3
async def test_web_identity_goes_through_sts_and_signs_with_its_temporary_credentials(aws_env, checked_s3, tmp_path):
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6Y3Jhd2w6YXJjaGl2ZXIifQ.c2ln")
    aws_env.setenv("AWS_ROLE_ARN", ROLE)
    aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    aws_env.setenv("AWS_ROLE_SESSION_NAME", "busscrape-ingester")
    store = open_storage(Settings(), location())
    # The first request is the STS call (botocore resolves before the first S3 request signs),
    # which moto cannot check unsigned; every S3 request after it is checked.
    checked_s3.unchecked(1)
    await round_trip(store)
    used = store.provider()
    # Issued by moto's STS for the role (not a key anyone configured), and the one that signed.
    assert used["access_key_id"].startswith("ASIA") and used["token"]
    who = aws(checked_s3, "sts", aws_access_key_id=used["access_key_id"],
              aws_secret_access_key=used["secret_access_key"], aws_session_token=used["token"]).get_caller_identity()
    assert who["Arn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/archiver/busscrape-ingester"


@pytest.mark.s3
async def test_refused_and_missing_credentials_stop_at_start(aws_env, checked_s3):
    aws_env.setenv("AWS_ACCESS_KEY_ID", checked_s3.access_key)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + uuid.uuid4().hex)
    with pytest.raises(AuthenticationFailed, match="AWS_PROFILE"):
        async with open_storage(Settings(), location()):
            pass
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigurationError, match="no credentials for s3://"):
        async with open_storage(Settings(), location()):
            pass


@pytest.mark.s3
async def test_the_fixed_key_settings_win_over_the_environment(aws_env, checked_s3):
    aws_env.setenv("AWS_ACCESS_KEY_ID", "AKIANOTTHEONE")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "not-the-one")
    settings = Settings(s3={**checked_s3.settings("fixed"), "endpoint": checked_s3.endpoint})
    store = open_storage(settings)
    assert isinstance(store, S3Storage) and store.url == "s3://fixed"
    await round_trip(store)


class _Metadata(http.server.BaseHTTPRequestHandler):
    """EC2's instance metadata service as botocore asks it (IMDSv2: a token, then the role's credentials)."""

    role = "archiver"
    credentials: ClassVar[dict[str, str]] = {}
    asked: ClassVar[list[str]] = []

    def do_PUT(self) -> None:
        self._answer("/latest/api/token", b"imds-token")

    def do_GET(self) -> None:
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            self._answer(base, self.role.encode())
        else:
            self._answer(base + self.role, json.dumps({"Code": "Success", "Type": "AWS-HMAC", **self.credentials,
                                                       "Expiration": "2099-01-01T00:00:00Z"}).encode())

    def _answer(self, path: str, body: bytes) -> None:
        type(self).asked.append(f"{self.command} {self.path}")
        token = self.headers.get("X-aws-ec2-metadata-token")
        ok = self.path == path and (self.command == "PUT" or token == "imds-token")
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body) if ok else 0))
        self.end_headers()
        if ok:
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.s3
async def test_instance_metadata_credentials(aws_env, checked_s3):
    checked_s3.unchecked(1)  # (moto cannot check the unsigned STS call that mints the role's credentials)
    issued = aws(checked_s3, "sts").assume_role_with_web_identity(
        RoleArn=ROLE, RoleSessionName="instance", WebIdentityToken="token")["Credentials"]
    _Metadata.credentials = {"AccessKeyId": issued["AccessKeyId"], "SecretAccessKey": issued["SecretAccessKey"],
                             "Token": issued["SessionToken"]}
    _Metadata.asked = []
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        aws_env.delenv("AWS_EC2_METADATA_DISABLED")
        aws_env.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.2:{server.server_port}/")
        store = open_storage(Settings(), location())
        await round_trip(store)
    finally:
        server.shutdown()
        server.server_close()
    assert store.provider()["access_key_id"] == issued["AccessKeyId"]
    assert "GET /latest/meta-data/iam/security-credentials/archiver" in _Metadata.asked
