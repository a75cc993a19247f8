"""``busscrape config`` through the real entry point: how settings are read from the environment."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import busscrape, clean_env


def effective(**env: str) -> dict:
    result = busscrape("config", "--json", env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("variable", "value", "section", "field", "expected"), [
    ("BUSSCRAPE_NETWORK__ALLOW", "127.0.0.2/32", "network", "allow", ["127.0.0.2/32"]),
    ("BUSSCRAPE_NETWORK__ALLOW", "127.0.0.2/32, intranet:443", "network", "allow", ["127.0.0.2/32", "intranet:443"]),
    ("BUSSCRAPE_NETWORK__ALLOW", '["127.0.0.2/32", "intranet:443"]', "network", "allow",
     ["127.0.0.2/32", "intranet:443"]),
    ("BUSSCRAPE_NETWORK__ALLOW", "", "network", "allow", []),
    ("BUSSCRAPE_DISPATCH__TRACKING_PARAMS", "utm_*,ref", "dispatch", "tracking_params", ["utm_*", "ref"]),
    ("BUSSCRAPE_BROWSER__EXTRA_ARGS", "--foo", "browser", "extra_args", ["--foo"]),
    ("BUSSCRAPE_BROWSER__EXTRA_ARGS", "--foo,--window-size=1280,800", "browser", "extra_args",
     ["--foo", "--window-size=1280,800"]),
    ("BUSSCRAPE_BROWSER__EXTRA_ARGS", '["--foo", "--bar=1,2"]', "browser", "extra_args", ["--foo", "--bar=1,2"]),
])
def test_list_settings_take_comma_separated_values_or_json(variable, value, section, field, expected):
    assert effective(**{variable: value})[section][field] == expected

