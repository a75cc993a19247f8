"""The images, each built once per run from the local base (tests/support/containers.py), and the
network namespace every container test module runs in (tests/support/netns.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ENV_AT_START
from tests.support import netns
from tests.support.containers import Images, missing, required, unavailable


@pytest.fixture(scope="session")
def images() -> Iterator[Images]:
    reason = missing()
    if reason:
        unavailable(reason, ENV_AT_START)
    images = Images()
    yield images
    print("image build times on this worker (s):", {k: round(v, 1) for k, v in images.timings.items()})


@pytest.fixture(scope="module", autouse=True)
def container_network(request: pytest.FixtureRequest) -> Iterator[None]:
    """The module's podman, containers and sites in the run's container namespace: what they
    change in the network stays out of the other tests' Chromium's sight. Set up before and torn
    down after the module's own fixtures (a stack brought up once for the module)."""
    path = netns.of(request.config)
    if path is None:
        if required(ENV_AT_START):
            pytest.fail("containers are required in this run but no network namespace could be made for "
                        "them (root and iproute2's `ip` are needed)", pytrace=False)
        yield  # a developer's machine: beside the other tests, as before
        return
    with netns.entered(path):
        yield
