"""Scope rules and crawl specs: no network at all (the public-suffix list is the bundled one)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from busscrape.crawl.scope import ScopeRules, registrable_domain
from busscrape.crawl.spec import CrawlSpec, crawl_task_id

SEED = "http://shop.example.co.uk/docs/guide/intro.html"


def rules(scope: str, **extra) -> ScopeRules:
    return ScopeRules(CrawlSpec(seeds=(SEED,), scope=scope, **extra))


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the suffix list must come from the package."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_registrable_domain_is_public_suffix_aware_and_offline(no_network):
    from busscrape.crawl import scope

    scope._extractor.cache_clear()  # build it here, under the guard
    assert registrable_domain("a.b.example.co.uk") == "example.co.uk"
    assert registrable_domain("x.co.uk") == "x.co.uk"
    assert registrable_domain("WWW.Example.COM.") == "example.com"
    assert registrable_domain("127.0.0.2") == "127.0.0.2"  # no suffix: the host is its own domain


@pytest.mark.parametrize(("scope", "url", "follows"), [
    ("page", "http://shop.example.co.uk/docs/guide/other.html", False),
    ("prefix", "http://shop.example.co.uk/docs/guide/other.html", True),
    ("prefix", "http://shop.example.co.uk/docs/guide/deep/er.html", True),
    ("prefix", "http://shop.example.co.uk/docs/other.html", False),
    ("prefix", "https://shop.example.co.uk/docs/guide/other.html", False),
    ("host", "https://shop.example.co.uk/anything", True),
    ("host", "http://blog.example.co.uk/", False),
    ("domain", "http://blog.example.co.uk/", True),
    ("domain", "http://example.co.uk/", True),
    ("domain", "http://other.co.uk/", False),  # co.uk is a public suffix, not a site
    ("any", "http://elsewhere.org/", True),
    ("any", "ftp://elsewhere.org/", False),
])
def test_each_scope(scope, url, follows):
    assert (rules(scope).verdict(url) is None) is follows


def test_include_and_exclude():
    r = rules("host", include=[r"/docs/"], exclude=[r"\.pdf$", r"[?&]print="])
    assert r.verdict("http://shop.example.co.uk/docs/a.html") is None
    assert r.verdict("http://shop.example.co.uk/blog/a.html") == "not_included"
    assert r.verdict("http://shop.example.co.uk/docs/a.pdf") == "excluded"
    assert r.verdict("http://shop.example.co.uk/docs/a?print=1") == "excluded"
    assert r.verdict("http://other.org/docs/a.html") == "out_of_scope"


def test_spec_refuses_bad_regex_and_bad_selector_naming_them():
    with pytest.raises(ValidationError, match=r"'\(' is not a regular expression"):
        CrawlSpec(seeds=(SEED,), include=["("])
    with pytest.raises(ValidationError, match=r"'a\[\[' is not a CSS selector"):
        CrawlSpec(seeds=(SEED,), follow="a[[")
    with pytest.raises(ValidationError, match="scope"):
        CrawlSpec(seeds=(SEED,), scope="site")


def test_crawl_id_names_the_crawl_and_task_ids_are_per_crawl():
    one, same, other = CrawlSpec(seeds=(SEED,)), CrawlSpec(seeds=(SEED,)), CrawlSpec(seeds=(SEED,), depth=1)
    assert one.crawl_id == same.crawl_id != other.crawl_id
    assert crawl_task_id(one.crawl_id, SEED) == crawl_task_id(same.crawl_id, SEED)
    assert crawl_task_id(one.crawl_id, SEED) != crawl_task_id(other.crawl_id, SEED)
