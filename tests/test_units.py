import pytest

from busscrape.units import format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), (90, 90), ("1.5s", 1.5), ("250ms", 0.25), ("5m", 300), ("1h30m", 5400), ("7d", 604800),
     ("2w", 1209600), (" 10 s ", 10), ("0", 0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5x", "m5", "-3", "1h 30q", True])
def test_parse_duration_rejects_with_the_text(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(text).strip()[:3] in str(info.value) or "empty" in str(info.value)


@pytest.mark.parametrize(("seconds", "text"), [(604800, "7d"), (90, "1m30s"), (0.25, "250ms"), (0, "0s"),
                                               (3661, "1h1m1s")])
def test_format_duration_round_trips(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "size"), [("1MiB", 2**20), ("20MB", 20_000_000), (512, 512), ("-1", -1),
                                            ("8GiB", 8 * 2**30)])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_parse_size_rejects_nonsense():
    with pytest.raises(ValueError):
        parse_size("lots")
