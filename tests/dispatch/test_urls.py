"""URL validation and normalisation: one spelling per page, a stable reason for every refusal."""

import pytest
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from busscrape.dispatch.urls import REASONS, UrlNormaliser, UrlRules, normalise
from busscrape.errors import InputError
from busscrape.settings import DispatchSettings

TRACKING = UrlRules.from_settings(DispatchSettings(strip_tracking=True))


@pytest.mark.parametrize(("given", "expected"), [
    ("HTTP://Example.COM/a", "http://example.com/a"),
    ("http://example.com", "http://example.com/"),
    ("http://example.com:80/a", "http://example.com/a"),
    ("https://example.com:443/a", "https://example.com/a"),
    ("http://example.com:443/a", "http://example.com:443/a"),
    ("https://example.com:8443/a", "https://example.com:8443/a"),
    ("http://example.com/a#section-2", "http://example.com/a"),
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/%7euser/%e4%2f", "http://example.com/~user/%E4%2F"),
    ("http://example.com/ä?ö=ü", "http://example.com/%C3%A4?%C3%B6=%C3%BC"),
    ("http://Bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
    ("  http://example.com/trailing-space  ", "http://example.com/trailing-space"),
    ("http://example.com/?", "http://example.com/"),
    # Numeric IPv4 hosts, read the way browsers read them.
    ("http://0x7f000001/", "http://127.0.0.1/"),
    ("http://2130706433:8080/", "http://127.0.0.1:8080/"),
    ("http://0177.0.0.1/", "http://127.0.0.1/"),
    ("http://127.1/", "http://127.0.0.1/"),
    ("http://[2001:DB8:0:0::1]:80/", "http://[2001:db8::1]/"),
    ("http://[::FFFF:127.0.0.1]/", "http://[::ffff:7f00:1]/"),
])
def test_normalises_to_one_spelling(given, expected):
    assert normalise(given) == expected


@pytest.mark.parametrize(("given", "reason"), [
    ("ftp://example.com/file", "unsupported_scheme"),
    ("javascript:alert(1)", "unsupported_scheme"),
    ("example.com/no-scheme", "unsupported_scheme"),
    ("//example.com/scheme-relative", "unsupported_scheme"),
    ("http://", "missing_host"),
    ("http:///path-only", "missing_host"),
    ("http://exa mple.com/", "invalid_characters"),
    ("http://example.com/a\tb", "invalid_characters"),
    ("http://example.com/\x00", "invalid_characters"),
    ("http://example.com/a\u2028b", "invalid_characters"),
    ("http://example.com:99999/", "invalid_url"),
    ("http://example.com:0/", "invalid_url"),
    ("http://[::1/", "invalid_url"),
    ("http://example.com\\evil/", "invalid_url"),
    ("http://1.2.3.4.5/", "invalid_host"),
    ("http://256.0.0.1/", "invalid_host"),
    ("http://09.1.1.1/", "invalid_host"),
    ("http://a..b/", "invalid_host"),
    ("http://a%20b.example/", "invalid_host"),
    ("http://" + "a" * 64 + ".example/", "invalid_host"),
    ("http://[fe80::1%25eth0]/", "invalid_host"),
    ("http://xn--zz.example/", "invalid_idna"),
    ("http://xn--ls8h.example/", "invalid_idna"),
    ("http://a\u200bb.example/", "invalid_idna"),
    ("http://example.com/" + "a" * 3000, "too_long"),
    ("http://user:pw@Example.com/", "credentials_in_url"),
    ("http://user@example.com/", "credentials_in_url"),
    ("http://:pw@example.com/", "credentials_in_url"),
    ("http://@example.com/", "credentials_in_url"),
    ("https://u:p%40ss@example.com/", "credentials_in_url"),
])
def test_rejects_with_a_stable_reason(given, reason):
    with pytest.raises(InputError) as info:
        normalise(given)
    assert info.value.reason == reason
    assert reason in REASONS
    assert str(info.value)  # a detail for the report, never empty


def test_the_length_limit_is_configurable_and_applies_after_normalisation():
    url = "http://example.com/" + "a" * 30
    assert normalise(url, UrlRules(max_length=len(url))) == url
    with pytest.raises(InputError, match="limit is 48") as info:
        normalise(url + "b", UrlRules(max_length=48))
    assert info.value.reason == "too_long"
    # %7e shrinks to ~: what counts is the normalised length.
    assert normalise("http://example.com/%7e%7e", UrlRules(max_length=21)) == "http://example.com/~~"


def test_tracking_parameters_go_and_the_rest_keeps_its_encoding():
    strip = UrlNormaliser(TRACKING)
    url = "http://example.com/p?utm_source=x&id=a%26b+c&UTM_Medium=y&fbclid=z&q=%E4&gclid=1#frag"
    assert strip(url) == "http://example.com/p?id=a%26b+c&q=%E4"
    assert strip("http://example.com/?utm_campaign=only") == "http://example.com/"
    # Off by default: the same URL keeps every parameter.
    assert normalise(url) == "http://example.com/p?utm_source=x&id=a%26b+c&UTM_Medium=y&fbclid=z&q=%E4&gclid=1"


def test_custom_tracking_patterns_use_wildcards():
    strip = UrlNormaliser(UrlRules(strip_tracking=True, tracking_params=("ref_*", "session")))
    assert strip("http://example.com/?ref_a=1&ref=2&session=3&sessionid=4") == "http://example.com/?ref=2&sessionid=4"


def test_query_sorting_is_by_name_and_stable():
    sort = UrlNormaliser(UrlRules(sort_query=True))
    assert sort("http://example.com/?b=2&a=9&c&a=1&&") == "http://example.com/?a=9&a=1&b=2&c"
    assert sort("http://example.com/?b=2&a=1") == sort("http://example.com/?a=1&b=2")
    assert normalise("http://example.com/?b=2&a=1") == "http://example.com/?b=2&a=1"


_URLISH = st.builds(
    lambda scheme, host, port, path, query, fragment: f"{scheme}://{host}{port}{path}{query}{fragment}",
    st.sampled_from(["http", "HTTP", "https", "Https", "ftp", ""]),
    st.one_of(st.from_regex(r"[A-Za-z0-9.\-_]{0,20}", fullmatch=True), st.text(max_size=12),
              st.sampled_from(["127.1", "0x7f.1", "[::1]", "[::FFFF:1.2.3.4]", "bücher.example", "xn--zz"])),
    st.sampled_from(["", ":80", ":443", ":8080", ":0", ":99999", ":"]),
    st.one_of(st.just(""), st.text(max_size=20).map(lambda t: "/" + t)),
    st.one_of(st.just(""), st.text(max_size=20).map(lambda t: "?" + t)),
    st.one_of(st.just(""), st.text(max_size=8).map(lambda t: "#" + t)),
)


@hsettings(max_examples=400, deadline=None)
@given(st.one_of(_URLISH, st.text(max_size=60)))
@example("http://example.com/%2e%2E/a")
@example("http://[::1]:80/?utm_source=1")
def test_every_text_is_either_normalised_stably_or_rejected_with_a_known_reason(text):
    for rules in (UrlRules(), UrlRules(strip_tracking=True, tracking_params=("utm_*",), sort_query=True)):
        normaliser = UrlNormaliser(rules)
        try:
            url = normaliser(text)
        except InputError as exc:
            assert exc.reason in REASONS
            continue
        assert url.startswith(("http://", "https://"))
        assert "#" not in url and len(url) <= rules.max_length
        assert normaliser(url) == url  # idempotent: a normalised URL is its own canonical form


def test_a_url_with_credentials_is_refused_with_how_to_send_them_instead():
    with pytest.raises(InputError) as info:
        normalise("http://alice:s3cret@example.com/private")
    assert info.value.reason == "credentials_in_url"
    assert "s3cret" not in str(info.value) and "options.headers" in str(info.value)
