"""List settings from one environment variable: ``a,b,c`` or a JSON array.

``BUSSCRAPE_NETWORK__ALLOW=127.0.0.2/32,intranet:443`` is what an operator writes; pydantic-settings
would read only ``'["127.0.0.2/32", "intranet:443"]'`` and fail on the rest with a message naming
the section. ``NoDecode`` hands the raw text to the validator below instead, which takes both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_settings import NoDecode

# Chromium switches carry commas in their values (--window-size=1280,800): a new item starts only
# at a comma followed by a dash.
_BEFORE_SWITCH = re.compile(r",(?=\s*-)")


def _split(separator: re.Pattern[str] | str) -> Callable[[Any], Any]:
    def split(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"starts with [ but is not a JSON array ({exc.msg})") from None
        parts = separator.split(text) if isinstance(separator, re.Pattern) else text.split(separator)
        return [part.strip() for part in parts if part.strip()]

    return split


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split(","))]
"""A list of strings: ``a,b,c`` (spaces around items ignored, empty items dropped) or a JSON array."""

SwitchList = Annotated[list[str], NoDecode, BeforeValidator(_split(_BEFORE_SWITCH))]
"""Command-line switches: ``--a,--b=1,2`` is ``["--a", "--b=1,2"]`` (a comma starts a new switch only
before a dash), or a JSON array."""
