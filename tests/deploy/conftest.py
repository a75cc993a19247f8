"""The images, built once per session from the local base (tests/support/containers.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ENV_AT_START
from tests.support.containers import Images, build_all, missing, unavailable


@pytest.fixture(scope="session")
def images() -> Images:
    reason = missing()
    if reason:
        unavailable(reason, ENV_AT_START)
    built = build_all()
    print("image build times (s):", {k: round(v, 1) for k, v in built.timings.items()})
    return built
