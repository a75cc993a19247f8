import pytest

from busscrape.errors import ConfigurationError
from busscrape.worker.status_policy import StatusPolicy, parse_statuses


def test_ranges_and_precedence():
    policy = StatusPolicy.parse("408,429,500-599", "400-499")
    assert policy.verdict(503) == "retry" and policy.verdict(429) == "retry"
    assert policy.verdict(404) == "dead" and policy.verdict(200) is None and policy.verdict(None) is None
    assert policy.verdict(302) is None


@pytest.mark.parametrize("bad", ["abc", "600", "500-400", "50-60"])
def test_bad_specs_name_the_setting(bad):
    with pytest.raises(ConfigurationError, match="S"):
        parse_statuses(bad, "SETTING")
