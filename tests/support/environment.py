"""The environment the developer started the run with, and the clean one the tests run in.

The tests never read the developer's own configuration (``BUSSCRAPE_*``), but a few of those
variables are meant for the tests themselves (``BUSSCRAPE_REQUIRE_*``, ``BUSSCRAPE_CHAOS_SEED``,
``BUSSCRAPE_TEST_TIMELINE``): ``AT_START`` keeps them. xdist spawns its workers from the
controller's environment after the controller has cleaned it, so the removed variables travel to
the workers under a name the cleaning spares.
"""

from __future__ import annotations

import json
import os

_REMOVED = "TESTS_REMOVED_BUSSCRAPE_ENV"

# What this process was given wins over what a controller passed on (a test may start a pytest of
# its own with variables of its own).
AT_START: dict[str, str] = {**json.loads(os.environ.get(_REMOVED, "{}")), **os.environ}


def clean() -> None:
    """Take every ``BUSSCRAPE_*`` variable out of this process's environment (and its children's)."""
    os.environ[_REMOVED] = json.dumps({k: v for k, v in AT_START.items() if k.startswith("BUSSCRAPE_")})
    for name in list(os.environ):
        if name.startswith("BUSSCRAPE_"):
            del os.environ[name]
