"""The console's small rules, one by one: which URLs become links, which archive keys and login
targets are taken, which Host headers are loopback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from busscrape.api.console.folders import folder_key
from busscrape.api.console.guard import Refused, loopback_host
from busscrape.api.console.render import snippet, web_href

TASK = "a" * 32


@pytest.mark.parametrize("url", ["javascript:alert(1)", " JavaScript:alert(1)", "JAVASCRIPT:x", "data:text/html,x",
                                 "vbscript:x", "file:///etc/passwd", "//127.0.0.9/", "/console/", "",
                                 "http://a/\nb", None, 5])
def test_only_http_urls_become_links(url):
    assert web_href(url) is None


@pytest.mark.parametrize("url", ["http://127.0.0.2/?next=javascript:alert(1)", "https://x.example/a"])
def test_http_and_https_urls_are_links(url):
    assert web_href(url) == url


def test_a_snippet_marks_its_matches_and_escapes_the_rest():
    assert str(snippet("<b>⟦quokka⟧</b> & <script>")) == ("&lt;b&gt;<mark>quokka</mark>&lt;/b&gt; &amp; "
                                                          "&lt;script&gt;")


@pytest.mark.parametrize("key", [f"dt=2026-01-01/host=a/{TASK}", f"pre/fix/dt=2026-01-01/host=a.b/{TASK}"])
def test_a_page_folder_of_the_archive_layout_is_taken(key):
    assert folder_key(key) == key


@pytest.mark.parametrize("key", ["", TASK, f"../dt=x/host=a/{TASK}", f"dt=x/host=a/../{TASK}",
                                 f"/dt=x/host=a/{TASK}", f"dt=x/host=a/{TASK}/", f"dt=x/host=a/{TASK}/meta.json",
                                 f".staging/dt=x/host=a/{TASK}", f"dt=x/nohost/{TASK}", "dt=x/host=a/" + "A" * 32,
                                 "x/" * 2000 + f"dt=x/host=a/{TASK}"])
def test_anything_else_is_refused_as_a_folder(key):
    with pytest.raises(Refused) as refused:
        folder_key(key)
    assert refused.value.status == 400


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:8080", True), ("127.0.0.2", True), ("localhost:8080", True), ("LOCALHOST", True),
    ("[::1]:8080", True), ("app.localhost:1", True), ("attacker.example", False),
    ("attacker.example:8080", False), ("127.0.0.1.nip.io:8080", False), ("", False), ("10.0.0.1:80", False)])
def test_loopback_host_headers(host, loopback):
    assert loopback_host(host) is loopback


def test_busscrape_help_imports_neither_jinja_nor_the_console():
    code = ("import runpy, sys\nsys.argv = ['busscrape', '--help']\ntry:\n"
            "    runpy.run_module('busscrape', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('loaded:', sorted(m for m in ('jinja2', 'busscrape.api.console') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "loaded: []", done.stdout[-2000:] + done.stderr[-2000:]
