"""The images, each built once per run from the local base (tests/support/containers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ENV_AT_START
from tests.support.containers import Images, missing, unavailable


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    reason = missing()
    if reason:
        unavailable(reason, ENV_AT_START)
    images = Images()
    yield images
    print("image build times on this worker (s):", {k: round(v, 1) for k, v in images.timings.items()})
