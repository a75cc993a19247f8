"""The nats-py internals busscrape uses are checked when it starts, and named when one is gone."""

import subprocess
import sys

from nats.aio.client import Client

from busscrape.bus import compat


def test_this_nats_py_has_every_internal_busscrape_uses():
    assert compat._missing() == []


def test_a_missing_internal_is_named_with_the_nats_py_version(monkeypatch):
    monkeypatch.delattr(Client, "_flush_pending")
    assert compat._missing() == ["Client._flush_pending"]
    # Imported afresh (as at start), the module refuses to load and says what to do.
    script = ("from nats.aio.client import Client; del Client._flush_pending; "
              "import busscrape.bus.compat")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 1
    assert "ImportError" in run.stderr and "Client._flush_pending" in run.stderr
    assert f"nats-py {compat._nats_py_version()}" in run.stderr


def test_encoded_headers_read_back_as_the_dict():
    block = compat.encode_headers({"Nats-Msg-Id": "a-1", "traceparent": "00-x"}).encode()
    assert block.startswith(b"NATS/1.0\r\n") and block.endswith(b"\r\n\r\n")
    assert compat.decode_headers(block) == {"Nats-Msg-Id": "a-1", "traceparent": "00-x"}
