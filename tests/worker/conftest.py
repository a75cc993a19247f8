"""The worker's tests' settings: the site's addresses allowed, short waits, three deliveries."""

from __future__ import annotations

import pytest

from busscrape.bus import provision, topology
from tests.conftest import make_settings


@pytest.fixture
def wsettings(tmp_path, nats_url, site):
    return make_settings(
        tmp_path, nats_url,
        network={"allow": [f"{h}/32" for h in site.hosts]},
        worker={"concurrency": 2, "navigation_timeout": "5s", "retry_base_delay": "200ms",
                "retry_max_delay": "1s", "exit_when_idle": "1.5s"},
        streams={"worker_max_deliver": 3},
    )


@pytest.fixture
async def wbus(bus, wsettings):
    """A clean server with every stream, consumer and bucket of ``wsettings``."""
    await provision.apply(bus.js, topology.load(wsettings))
    return bus
