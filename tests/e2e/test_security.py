"""Secured connections, end to end, through the real CLI.

Each NATS credential mode runs against a real nats-server configured for it (user/password,
token, nkey, operator/JWT with a ``.creds`` file, TLS, mutual TLS): with the right credential
``busscrape streams apply`` succeeds and a task queued over a connection made from the same
variables is read back; a wrong one makes the command exit at start with 3 (credentials refused)
or 2 (a server we cannot verify, no server, a file that holds no credential) and a message that
names the setting to fix, and no output holds a secret. S3 over TLS likewise, moto serving HTTPS
with a certificate from a CA the test made. Every CLI start costs a couple of CPU seconds, so the
first wrong credential of each mode goes through the CLI and the others through ``Bus.connect``,
the code the CLI runs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import typer.main

from busscrape.archive.storage.s3 import S3Storage
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.cli import app
from busscrape.errors import (
    EXIT_AUTH,
    EXIT_CONFIG,
    EXIT_OK,
    AuthenticationFailed,
    ConfigurationError,
    NatsUnavailable,
)
from busscrape.model.messages import ScrapeTask, decode
from busscrape.ops.nats_server import EmbeddedNatsServer
from busscrape.settings import Settings
from tests.ingest.test_daemon import HTML, PNG, assert_archived, produce
from tests.support import nats_auth
from tests.support.bus import enqueue, stream_messages, wait_until
from tests.support.net import refused_port
from tests.support.pki import TestCA
from tests.support.s3 import S3Server

URL = "http://127.0.0.2:8000/secured"
N = "BUSSCRAPE_NATS__"
# A connect budget no test waits for: a refusal that is not recognised as one shows as a hang.
PATIENT = {f"{N}CONNECT_TIMEOUT": "300"}


# -- running the CLI ---------------------------------------------------------------------------


@dataclass
class Ran:
    args: list[str]
    returncode: int
    output: str  # stdout and stderr


def base_env(tmp_path: Path, nats_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update({"BUSSCRAPE_STATE_DIR": str(tmp_path / "state"), "BUSSCRAPE_NATS__URL": nats_url,
                "BUSSCRAPE_TELEMETRY__HTTP_PORT": "none", "BUSSCRAPE_TELEMETRY__LOG_FORMAT": "json",
                "BUSSCRAPE_NATS__CONNECT_TIMEOUT": "3", "COLUMNS": "400"})
    return env


def run_all(jobs: list[tuple[list[str], dict[str, str]]], timeout: float = 150) -> list[Ran]:
    """``busscrape ARGS`` once per job, all at once; each one's exit code and output."""
    outs = [tempfile.TemporaryFile() for _ in jobs]
    procs = [subprocess.Popen([sys.executable, "-m", "busscrape", *args], env=env, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
             for (args, env), out in zip(jobs, outs, strict=True)]
    try:
        deadline = time.monotonic() + timeout
        for (args, _), proc in zip(jobs, procs, strict=True):
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"`busscrape {' '.join(args)}` did not finish within {timeout}s") from None
        ran = []
        for (args, _), proc, out in zip(jobs, procs, outs, strict=True):
            out.seek(0)
            ran.append(Ran(args, proc.returncode, out.read().decode(errors="replace")))
        return ran
    finally:
        for proc, out in zip(procs, outs, strict=True):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()


def flat(text: str) -> str:
    """Output with the terminal's line wrapping undone (messages are checked word for word)."""
    return " ".join(text.split())


def assert_no_secret(ran: list[Ran], secret_values: list[str]) -> None:
    for r in ran:
        unwrapped = "".join(r.output.split())  # a secret folded across lines is still printed
        for value in secret_values:
            assert value not in unwrapped, f"`busscrape {' '.join(r.args)}` printed a secret:\n{r.output}"
        assert "Traceback" not in r.output, r.output


# -- one real nats-server per credential mode --------------------------------------------------


@dataclass
class Refusal:
    """A wrong credential, and how the CLI must refuse it."""

    what: str
    env: dict[str, str]
    exit_code: int
    says: tuple[str, ...]
    timeout: dict[str, str] = field(default_factory=dict)


@dataclass
class Mode:
    server_config: str
    scheme: str
    right: dict[str, str]
    wrong: list[Refusal]
    secrets: list[str] = field(default_factory=list)


def nats_mode(name: str, folder: Path) -> Mode:
    """The server configuration, the right credential and the wrong ones, for one auth mode."""
    n = N
    if name == "user_password":
        password, guess = secrets.token_hex(12), secrets.token_hex(12)
        return Mode(
            f'authorization {{ user: "scraper", password: "{password}" }}\n', "nats",
            {f"{n}USER": "scraper", f"{n}PASSWORD": password},
            [Refusal("wrong password", {f"{n}USER": "scraper", f"{n}PASSWORD": guess}, EXIT_AUTH,
                     ("refused the credentials", f"{n}USER and {n}PASSWORD")),
             Refusal("no server", {f"{n}URL": f"nats://127.0.0.1:{refused_port()}", f"{n}USER": "scraper",
                                   f"{n}PASSWORD": password}, EXIT_CONFIG,
                     ("cannot connect to NATS", f"{n}URL"), timeout={f"{n}CONNECT_TIMEOUT": "1"})],
            [password, guess])
    if name == "token":
        token, guess = secrets.token_hex(16), secrets.token_hex(16)
        return Mode(
            f'authorization {{ token: "{token}" }}\n', "nats", {f"{n}TOKEN": token},
            [Refusal("wrong token", {f"{n}TOKEN": guess}, EXIT_AUTH, ("refused the credentials", f"{n}TOKEN")),
             Refusal("no credential", {}, EXIT_AUTH, ("refused the credentials", "no credentials are configured"))],
            [token, guess])
    if name == "nkey":
        user, stranger = nats_auth.new_nkey("user"), nats_auth.new_nkey("user")
        garbage = folder / "garbage.nk"
        garbage.write_text(f"SU{secrets.token_hex(20).upper()}\n")
        return Mode(
            f'authorization {{ users = [ {{ nkey: "{user.public}" }} ] }}\n', "nats",
            {f"{n}NKEY_SEED_FILE": str(nats_auth.write_seed(folder / "user.nk", user))},
            [Refusal("unknown nkey", {f"{n}NKEY_SEED_FILE": str(nats_auth.write_seed(folder / "stranger.nk",
                                                                                       stranger))},
                     EXIT_AUTH, ("refused the credentials", f"{n}NKEY_SEED_FILE")),
             Refusal("not a seed", {f"{n}NKEY_SEED_FILE": str(garbage)}, EXIT_CONFIG,
                     (f"{n}NKEY_SEED_FILE", "does not hold a user nkey seed"))],
            [user.seed, stranger.seed, garbage.read_text().strip()])
    if name == "creds":
        trusted = nats_auth.decentralised()
        # A user whose JWT an account signed that the server's operator never did.
        rogue_account, rogue = nats_auth.new_nkey("account"), nats_auth.new_nkey("user")
        rogue_creds = nats_auth.write_creds(folder / "rogue.creds", nats_auth.user_jwt_for(rogue, rogue_account),
                                            rogue.seed)
        return Mode(
            trusted.server_config(folder), "nats", {f"{n}CREDS_FILE": str(trusted.creds(folder / "user.creds"))},
            [Refusal("untrusted account", {f"{n}CREDS_FILE": str(rogue_creds)}, EXIT_AUTH,
                     ("refused the credentials", f"{n}CREDS_FILE"))],
            [trusted.user.seed, rogue.seed])
    ca, stranger_ca = TestCA(folder / "ca"), TestCA(folder / "stranger-ca", name="another CA")
    server = ca.issue("nats-server")
    if name == "tls":
        return Mode(
            f'tls {{ cert_file: "{server.cert}", key_file: "{server.key}", timeout: 2 }}\n', "tls",
            {f"{n}TLS_CA_FILE": str(ca.cert)},
            [Refusal("another CA", {f"{n}TLS_CA_FILE": str(stranger_ca.cert)}, EXIT_CONFIG,
                     ("TLS verification of the NATS server", f"{n}TLS_CA_FILE")),
             Refusal("another name", {f"{n}TLS_CA_FILE": str(ca.cert), f"{n}TLS_HOSTNAME": "elsewhere.localhost"},
                     EXIT_CONFIG, ("TLS verification of the NATS server", f"{n}TLS_HOSTNAME"))])
    assert name == "mutual_tls", name
    client, stranger = ca.issue("client", client=True), stranger_ca.issue("client", client=True)
    return Mode(
        f'tls {{ cert_file: "{server.cert}", key_file: "{server.key}", ca_file: "{ca.cert}", verify: true, '
        "timeout: 2 }\n", "tls",
        # The server's certificate is checked against the name, not the address we dial.
        {f"{n}TLS_CA_FILE": str(ca.cert), f"{n}TLS_CERT_FILE": str(client.cert),
         f"{n}TLS_KEY_FILE": str(client.key), f"{n}TLS_HOSTNAME": "localhost"},
        [Refusal("no client certificate", {f"{n}TLS_CA_FILE": str(ca.cert)}, EXIT_AUTH,
                 ("refused the TLS client certificate", f"{n}TLS_CERT_FILE")),
         Refusal("a stranger's certificate", {f"{n}TLS_CA_FILE": str(ca.cert), f"{n}TLS_CERT_FILE": str(stranger.cert),
                                               f"{n}TLS_KEY_FILE": str(stranger.key)}, EXIT_AUTH,
                 ("refused the TLS client certificate", f"{n}TLS_CERT_FILE"))])


MODES = ["user_password", "token", "nkey", "creds", "tls", "mutual_tls"]


@pytest.mark.parametrize("mode_name", MODES)
def test_each_nats_credential_mode_works_and_a_wrong_credential_exits_at_start(mode_name, tmp_path, monkeypatch):
    mode = nats_mode(mode_name, tmp_path)
    conf = tmp_path / "server.conf"
    conf.write_text(mode.server_config)
    with EmbeddedNatsServer(tmp_path / "nats", config_file=conf) as server:
        env = base_env(tmp_path, f"{mode.scheme}://127.0.0.1:{server.port}")
        # The CLI, twice at once (every start costs a couple of CPU seconds): the right credential
        # applies the streams, the first wrong one is refused. A refusal gets a connect budget
        # (2 x 300s) far beyond run_all's patience, so finishing at all shows it was refused at once.
        first = mode.wrong[0]
        applied, refused = run_all([
            (["streams", "apply"], {**env, **mode.right}),
            (["streams", "apply"], {**env, **first.env, **PATIENT, **first.timeout}),
        ])
        assert applied.returncode == EXIT_OK, applied.output
        assert "changed" in applied.output, applied.output
        assert refused.returncode == first.exit_code, f"{first.what}: {refused.output}"
        for words in first.says:
            assert words in flat(refused.output), f"{first.what}: {refused.output}"
        assert_no_secret([applied, refused], mode.secrets)

        # A message round trip over a connection made from the same variables, and the other
        # wrong credentials refused by the same code path the CLI took.
        right = settings_from(monkeypatch, {**env, **mode.right})
        assert asyncio.run(_round_trip(right)) == [URL]
        for wrong in mode.wrong[1:]:
            started = time.monotonic()
            with pytest.raises(ConfigurationError) as info:
                asyncio.run(Bus.connect(settings_from(monkeypatch, {**env, **wrong.env, **PATIENT, **wrong.timeout}),
                                        name="t"))
            assert info.value.exit_code == wrong.exit_code, f"{wrong.what}: {info.value}"
            for words in wrong.says:
                assert words in str(info.value), f"{wrong.what}: {info.value}"
            assert time.monotonic() - started < 60, wrong.what  # not the 600s budget
            assert not any(value in str(info.value) for value in mode.secrets), str(info.value)


def settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """The settings a process would build from ``env`` (its BUSSCRAPE_* variables only)."""
    with monkeypatch.context() as m:
        for name in [k for k in os.environ if k.startswith("BUSSCRAPE_")]:
            m.delenv(name)
        for name, value in env.items():
            if name.startswith("BUSSCRAPE_"):
                m.setenv(name, value)
        return Settings()


async def _round_trip(settings: Settings) -> list[str]:
    """Queue a task the way the dispatcher does and read TASKS back: the URLs queued."""
    async with await Bus.connect(settings, name="test-security") as bus:
        await enqueue(bus.js, URL)

        async def sourced() -> bool:  # TASKS sources SEEN asynchronously
            return (await bus.js.stream_info(names.TASKS_STREAM)).state.messages > 0

        await wait_until(sourced, timeout=30)
        return [decode(ScrapeTask, m.data).url for m in await stream_messages(bus.js, names.TASKS_STREAM)]


@pytest.mark.parametrize("server_tls", ["none", "optional"])
async def test_tls_asked_for_is_never_dropped_for_plaintext(server_tls, tmp_path):
    """A client that wants TLS sends nothing in the clear: no TLS on offer is exit 2 before CONNECT
    (the password is right, so a plaintext CONNECT would have got in), optional TLS is taken."""
    password = secrets.token_hex(12)
    config = f'authorization {{ user: "scraper", password: "{password}" }}\n'
    ca = TestCA(tmp_path / "ca")
    if server_tls == "optional":
        server_cert = ca.issue("nats-server")
        config += f'tls {{ cert_file: "{server_cert.cert}", key_file: "{server_cert.key}" }}\nallow_non_tls: true\n'
    conf = tmp_path / "server.conf"
    conf.write_text(config)
    with EmbeddedNatsServer(tmp_path / "nats", config_file=conf) as server:
        settings = Settings(state_dir=tmp_path, nats={
            "url": f"nats://127.0.0.1:{server.port}", "user": "scraper", "password": password,
            "tls_ca_file": ca.cert, "connect_timeout": 100})
        if server_tls == "none":
            started = time.monotonic()
            with pytest.raises(NatsUnavailable, match="does not offer TLS") as info:
                await Bus.connect(settings, name="t")
            assert time.monotonic() - started < 30 and info.value.exit_code == EXIT_CONFIG  # budget: 200s
            # No CONNECT reached the server: no connection, open or closed, was ever authorised
            # (one still open is the refused socket not yet reaped on a loaded machine).
            seen = (await asyncio.to_thread(_connz, server, "?state=any&auth=true"))["connections"]
            assert seen and not any(c.get("authorized_user") for c in seen), seen
            return
        async with await Bus.connect(settings, name="tls-wanted") as bus:
            await bus.js.account_info()
            connections = (await asyncio.to_thread(_connz, server))["connections"]
        [ours] = [c for c in connections if c.get("name") == "tls-wanted"]
        assert ours.get("tls_version"), ours


def _connz(server: EmbeddedNatsServer, query: str = "") -> dict:
    with urllib.request.urlopen(f"{server.monitor_url}/connz{query}", timeout=5) as response:
        return orjson.loads(response.read())


async def test_a_creds_file_whose_seed_is_not_the_jwts_user_is_refused(tmp_path):
    """The JWT alone proves nothing: the server checks the nonce signature against its subject."""
    trusted = nats_auth.decentralised()
    conf = tmp_path / "server.conf"
    conf.write_text(trusted.server_config(tmp_path))
    mixed = nats_auth.write_creds(tmp_path / "mixed.creds", trusted.user_jwt, nats_auth.new_nkey("user").seed)
    with EmbeddedNatsServer(tmp_path / "nats", config_file=conf) as server:
        settings = Settings(state_dir=tmp_path, nats={"url": f"nats://127.0.0.1:{server.port}",
                                                       "creds_file": mixed, "connect_timeout": 3})
        with pytest.raises(AuthenticationFailed, match="BUSSCRAPE_NATS__CREDS_FILE"):
            await Bus.connect(settings, name="t")


@pytest.mark.parametrize("setting", ["creds_file", "tls_cert_file"])
async def test_a_credential_file_that_holds_something_else_is_named_before_connecting(setting, tmp_path):
    junk = tmp_path / "junk"
    junk.write_text("hunter2-not-a-credential\n")
    extra = {setting: junk, **({"tls_key_file": junk} if setting == "tls_cert_file" else {})}
    settings = Settings(nats={"url": f"nats://127.0.0.1:{refused_port()}", "connect_timeout": 1, **extra})
    with pytest.raises(ConfigurationError) as info:
        await Bus.connect(settings, name="t")
    assert f"BUSSCRAPE_NATS__{setting.upper()}" in str(info.value)
    assert "hunter2" not in str(info.value)


# -- S3 over TLS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_s3(tmp_path_factory):
    """moto serving HTTPS with a certificate from a test CA, accepting only the key it issued."""
    folder = tmp_path_factory.mktemp("tls-s3")
    ca = TestCA(folder / "ca")
    server = S3Server(folder, tls=ca.issue("s3"), check_credentials=True).start()
    yield server
    server.stop()


@pytest.mark.s3
async def test_s3_over_tls_writes_and_reads_with_the_test_ca(tls_s3):
    assert tls_s3.tls is not None
    cfg = Settings(s3={**tls_s3.settings("tls-roundtrip"), "ca_file": tls_s3.tls.ca}).s3
    assert cfg.secure
    async with S3Storage(cfg) as store:
        await store.put_bytes("dt=2025-01-01/x/meta.json", b"{}\n", content_type="application/json")
        assert await store.get("dt=2025-01-01/x/meta.json") == b"{}\n"
        assert await store.keys("dt=2025-01-01/") == ["dt=2025-01-01/x/meta.json"]


@pytest.mark.s3
@pytest.mark.parametrize("case", ["another CA", "system CAs", "plain HTTP", "CA without TLS"])
async def test_s3_tls_mismatches_fail_at_start_with_the_setting_to_fix(case, tls_s3, tmp_path):
    extra = {"another CA": {"ca_file": TestCA(tmp_path / "ca").cert}, "system CAs": {},
             "plain HTTP": {"secure": False}, "CA without TLS": {"secure": False, "ca_file": tls_s3.tls.ca}}[case]
    says = {"another CA": "BUSSCRAPE_S3__CA_FILE", "system CAs": "BUSSCRAPE_S3__CA_FILE",
            "plain HTTP": "BUSSCRAPE_S3__SECURE=true", "CA without TLS": "BUSSCRAPE_S3__SECURE=true"}[case]
    cfg = Settings(s3={**tls_s3.settings("tls-mismatch"), **extra}).s3
    with pytest.raises(ConfigurationError) as info:
        async with S3Storage(cfg):
            pass
    assert not isinstance(info.value, AuthenticationFailed)
    assert says in str(info.value)
    if case in {"another CA", "system CAs"}:
        assert "TLS verification" in str(info.value)


@pytest.mark.s3
async def test_the_ingester_archives_over_tls_and_a_wrong_ca_exits_2_at_start(tls_s3, applied, settings,
                                                                                     tmp_path):
    assert tls_s3.tls is not None
    files = {"page.html": HTML, "screenshot.png": PNG}
    result = await produce(applied.js, files=files)
    env = base_env(tmp_path, settings.nats.url or "")
    s3 = {"BUSSCRAPE_S3__ENDPOINT": tls_s3.endpoint, "BUSSCRAPE_S3__BUCKET": "tls-ingester",
          "BUSSCRAPE_S3__ACCESS_KEY": tls_s3.access_key, "BUSSCRAPE_S3__SECRET_KEY": tls_s3.secret_key,
          "BUSSCRAPE_S3__SECURE": "true", "BUSSCRAPE_S3__CA_FILE": str(tls_s3.tls.ca)}
    cmd = ["ingester", "--max-results", "1", "--exit-when-idle", "20"]
    archived, wrong_ca = await asyncio.to_thread(run_all, [
        (cmd, {**env, **s3}),
        (cmd, {**env, **s3, "BUSSCRAPE_S3__CA_FILE": str(TestCA(tmp_path / "other").cert)}),
    ])
    assert archived.returncode == EXIT_OK, archived.output
    assert wrong_ca.returncode == EXIT_CONFIG, wrong_ca.output
    assert "TLS verification" in flat(wrong_ca.output) and "BUSSCRAPE_S3__CA_FILE" in flat(wrong_ca.output)
    assert_no_secret([archived, wrong_ca], [tls_s3.secret_key])
    cfg = Settings(s3={**tls_s3.settings("tls-ingester"), "ca_file": tls_s3.tls.ca}).s3
    async with S3Storage(cfg) as store:
        await assert_archived(store, result, files)


@pytest.mark.s3
async def test_s3_over_tls_refuses_a_wrong_key_without_showing_it(tls_s3):
    """(The command's exit 3 for this is tests/test_storage.py's, over plain HTTP: same code.)"""
    guess = secrets.token_hex(20)
    cfg = Settings(s3={**tls_s3.settings("tls-wrong-key"), "ca_file": tls_s3.tls.ca, "secret_key": guess}).s3
    with pytest.raises(AuthenticationFailed, match="BUSSCRAPE_S3__SECRET_KEY") as info:
        async with S3Storage(cfg):
            pass
    assert info.value.exit_code == EXIT_AUTH
    assert guess not in str(info.value) and tls_s3.secret_key not in str(info.value)


# -- secrets stay secret -----------------------------------------------------------------------

SECRET_ENV = {
    "BUSSCRAPE_NATS__USER": "scraper",
    "BUSSCRAPE_NATS__PASSWORD": "pw-" + secrets.token_hex(8),
    "BUSSCRAPE_NATS__TOKEN": "tok-" + secrets.token_hex(8),
    "BUSSCRAPE_S3__ACCESS_KEY": "AK" + secrets.token_hex(8).upper(),
    "BUSSCRAPE_S3__SECRET_KEY": "sk-" + secrets.token_hex(16),
}
SECRETS = [v for k, v in SECRET_ENV.items() if not k.endswith("__USER")]


def test_config_and_settings_errors_never_show_a_secret(tmp_path):
    env = {**base_env(tmp_path, "nats://127.0.0.1:4222"), **SECRET_ENV}
    url_pw = "urlpw-" + secrets.token_hex(8)
    in_url = {**env, "BUSSCRAPE_NATS__URL": f"nats://scraper:{url_pw}@127.0.0.1:{refused_port()}",
              "BUSSCRAPE_NATS__CONNECT_TIMEOUT": "1"}
    del in_url["BUSSCRAPE_NATS__PASSWORD"]  # so the URL's password is the one used
    table, as_json, invalid = run_all([
        (["config"], env),
        (["config", "--json"], in_url),
        (["config"], {**env, "BUSSCRAPE_NATS__CONNECT_TIMEOUT": "soon"}),
    ])
    assert table.returncode == as_json.returncode == EXIT_OK, table.output + as_json.output
    assert "**********" in table.output and "BUSSCRAPE_NATS__PASSWORD" in table.output
    doc = orjson.loads(as_json.output)
    assert doc["nats"]["password"] == doc["nats"]["token"] == doc["s3"]["secret_key"] == "**********"
    # Credentials written into the URL are moved out of it, where they are masked like the rest.
    assert doc["nats"]["url"].startswith("nats://127.0.0.1:") and doc["nats"]["user"] == "scraper"
    assert invalid.returncode == EXIT_CONFIG, invalid.output
    assert "BUSSCRAPE_NATS__CONNECT_TIMEOUT='soon'" in invalid.output, invalid.output
    assert_no_secret([table, as_json, invalid], [*SECRETS, url_pw])


def test_settings_mask_secrets_in_repr_and_dumps(monkeypatch):
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert s.nats.password is not None and s.nats.password.get_secret_value() == SECRET_ENV["BUSSCRAPE_NATS__PASSWORD"]
    shown = [repr(s), str(s), repr(s.nats), repr(s.s3), s.model_dump_json(), str(s.model_dump(mode="json"))]
    for text in shown:
        for value in SECRETS:
            assert value not in text


async def test_a_url_with_credentials_keeps_them_out_of_the_url_and_every_message():
    s = Settings(nats={"url": "nats://scraper:hunter2@127.0.0.1:4222,tls://t0ken@127.0.0.1:4223"})
    assert s.nats.url == "nats://127.0.0.1:4222,tls://127.0.0.1:4223"
    assert s.nats.user == "scraper" and s.nats.password is not None and s.nats.token is not None
    assert (s.nats.password.get_secret_value(), s.nats.token.get_secret_value()) == ("hunter2", "t0ken")
    explicit = Settings(nats={"url": "nats://someone:else@127.0.0.1:4222", "user": "scraper", "password": "right"})
    assert explicit.nats.user == "scraper" and explicit.nats.password.get_secret_value() == "right"
    port = refused_port()
    unreachable = Settings(nats={"url": f"nats://scraper:hunter2@127.0.0.1:{port}", "connect_timeout": 1})
    with pytest.raises(NatsUnavailable) as info:
        await Bus.connect(unreachable, name="t")
    assert f"nats://127.0.0.1:{port}" in str(info.value) and "hunter2" not in str(info.value)


def test_no_command_takes_a_secret_as_a_flag():
    """Flags are visible to every user of the machine (ps, shell history): secrets come from env or files."""
    def options(command, path: str) -> list[tuple[str, str]]:
        found = [(path, opt) for param in command.params for opt in getattr(param, "opts", [])]
        for name, sub in getattr(command, "commands", {}).items():
            found += options(sub, f"{path} {name}")
        return found

    every = options(typer.main.get_command(app), "busscrape")
    assert any(opt == "--nats-url" for _, opt in every)  # the walk sees the real options
    words = ("pass", "token", "secret", "seed", "creds", "credential", "key")
    # (`crawl`'s positional SEED… URLs are named seeds: start URLs, not an NKey seed.)
    not_secrets = {("busscrape crawl", "seeds")}
    offending = [(cmd, opt) for cmd, opt in every
                 if any(w in opt.lower() for w in words) and (cmd, opt) not in not_secrets]
    assert offending == []
