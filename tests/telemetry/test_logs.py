"""Logs: no secret reaches them in either format, and the console format shows text as text."""

from __future__ import annotations

import io

import pytest
import structlog

from busscrape.search.postgres import masked
from busscrape.telemetry import logs
from tests.support.hostile_text import HOSTILE


@pytest.fixture
def captured():
    def configure(fmt: str) -> io.StringIO:
        out = io.StringIO()
        logs.configure(fmt, "info", stream=out)
        return out

    yield configure
    logs.configure("json", "info")


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_secrets_never_reach_the_logs(captured, fmt):
    out = captured(fmt)
    log = structlog.get_logger("test")
    log.info("connect", url="nats://scraper:hunter2@127.0.0.1:4222", password="hunter2",
             settings={"s3": {"secret_key": "hunter2", "endpoint": "127.0.0.1:9000"}})
    log.warning("nats.error", error="auth failed: password=hunter2 token: hunter2")
    log.info("task.done", url="https://user:hunter2@127.0.0.2/x?api_key=hunter2", task_id="abc")
    # No user, a password with '/' and '@' in it: the whole user-info goes.
    log.info("dsn", where="postgresql://:hunter2@127.0.0.1/db and redis://u:hun/ter2@x@127.0.0.1:6379/0")
    structlog.stdlib.get_logger("lib").error("library said secret=hunter2")
    try:
        raise RuntimeError("cannot reach nats://scraper:hunter2@127.0.0.1:4222")
    except RuntimeError:
        log.exception("boom")  # the traceback's text, in console format too
    text = out.getvalue()
    assert "hunter2" not in text and "hun/" not in text and "ter2" not in text
    assert text.count("***") >= 8
    assert "abc" in text and "127.0.0.2/x" in text and "RuntimeError" in text


def test_the_postgres_dsn_mask_hides_every_form_of_password():
    assert masked("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert masked("postgresql://:s3cret@db/x") == "postgresql://:***@db/x"
    assert masked("postgresql://app:s3@cr/et@db/x") == "postgresql://app:***@db/x"
    assert masked("host=db user=app password=s3cret dbname=x") == "host=db user=app password=*** dbname=x"


def test_console_logs_show_escape_sequences_instead_of_obeying_them(captured):
    out = captured("console")
    log = structlog.get_logger("test")
    log.warning("dispatch.rejected", text=HOSTILE, title=HOSTILE)
    structlog.stdlib.get_logger("lib").warning(HOSTILE)  # a library logging what it was given
    try:
        raise ValueError(HOSTILE)  # an exception quoting a page
    except ValueError:
        log.exception("render.failed")
    text = out.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and text.count("x1b") >= 12


RICH_ON_FIRST_USE = """
import io, json, sys
from busscrape.telemetry import logs  # busscrape first, as in a busscrape process
import structlog

lines = {}
for fmt in ("console", "json"):
    out = io.StringIO()
    logs.configure(fmt, stream=out)
    try:
        1 / 0
    except ZeroDivisionError:
        structlog.get_logger("t").exception("boom", secret_token="hunter2")
    lines[fmt] = out.getvalue()
before = "rich" in sys.modules
rich_box = io.StringIO()
try:
    1 / 0
except ZeroDivisionError:
    structlog.dev.rich_traceback(rich_box, sys.exc_info())  # the stand-in gives the real thing
print(json.dumps([before, "rich" in sys.modules, "ZeroDivisionError" in lines["console"],
                  "ZeroDivisionError" in json.loads(lines["json"])["exception"], "hunter2" in str(lines),
                  "Traceback" in rich_box.getvalue() and "\u256d" in rich_box.getvalue()]))
"""


def test_logging_an_exception_loads_no_rich_and_structlog_still_gets_it_when_asked():
    # busscrape.optional_imports: structlog imports rich at import; the daemons never use it.
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", RICH_ON_FIRST_USE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, True, True, True, False, True]
