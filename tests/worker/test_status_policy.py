import pytest

from busscrape.errors import ConfigurationError
from busscrape.worker.status_policy import StatusPolicy, parse_statuses


def test_ranges_and_precedence():
    policy = StatusPolicy.parse("408,429,500-599", "400-499")
    assert policy.verdict(503) == "retry" and policy.verdict(429) == "retry"
    assert policy.verdict(404) == "dead" and policy.verdict(200) is None and policy.verdict(None) is None
    assert policy.verdict(302) is None


@pytest.mark.parametrize(("bad", "why"), [("abc", "is not a status or a range like 500-599"),
                                          ("600", "is outside 100-599"), ("500-400", "is outside 100-599"),
                                          ("50-60", "is outside 100-599")])
def test_bad_specs_name_the_setting_the_part_and_the_reason(bad, why):
    with pytest.raises(ConfigurationError) as info:
        parse_statuses(f"404,{bad}", "SETTING")
    assert str(info.value) == f"SETTING: {bad!r} {why}"
