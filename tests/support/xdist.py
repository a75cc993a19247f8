"""Which tests share an xdist worker, and in what order they are handed out (``make test``).

``--dist loadgroup`` keeps the tests of one ``xdist_group`` on one worker and hands the rest out
one by one, in collection order, to whichever worker is free. The suite mostly waits (on timers,
on Chromium, on servers), so the makespan is set by its longest tests: they must start first,
each on a worker of its own, while the short ones fill the other workers around them. So:

- ``long`` (minutes: the fault runs, the 500-page crawl): a group per module, handed out first,
  so the runs of one module (the fault runs: each its own nats-servers, workers, Chromium and S3
  server) go one after another, never loading the machine for each other, while the other long
  modules and the short tests fill the other workers;
- ``timing`` (a test that measures pace, e.g. politeness delays): one group for all of them, so
  they never load the machine for one another, handed out next;
- ``containers`` (tests/deploy: podman images): one group, and one more for each name given as
  the marker's argument (``containers("compose")``: the compose stack, minutes long and holding
  its ports), handed out first with the ``long`` ones; the groups run side by side and take
  each image from whichever built it first (tests/support/containers.py, ``Images``), in one
  network namespace of their own (tests/support/netns.py);
- a test using a fixture its own module shares between tests (``scope="module"``: one server
  for a whole module, state earlier tests left): one group per module, so that fixture is made
  once, not once per worker;
- then ``slow``, then everything else, each in collection order.

Without xdist the groups change nothing and the order only puts the long tests first.
"""

from __future__ import annotations

import pytest

SHARED_SCOPES = ("module", "package", "class")


def group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker("long"):
        return f"long:{item.nodeid.split('::', 1)[0]}"
    if item.get_closest_marker("timing"):
        return "timing"
    containers = item.get_closest_marker("containers")
    if containers:  # the named ones (the compose stack) apart from the rest
        return f"containers:{containers.args[0]}" if containers.args else "containers"
    if _uses_a_module_fixture(item):
        return f"module:{item.nodeid.split('::', 1)[0]}"
    return None


def rank(item: pytest.Item) -> int:
    if item.get_closest_marker("long") or item.get_closest_marker("containers"):
        return 0
    if item.get_closest_marker("timing"):
        return 1
    if item.get_closest_marker("slow"):
        return 2
    return 3


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a shared fixture defined in its own module (conftest fixtures such
    as ``nats_server`` are cheap to make again and hold no state a test relies on)."""
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if fixturedef.scope in SHARED_SCOPES and fixturedef.baseid == module:
                return True
    return False


def arrange(items: list[pytest.Item]) -> None:
    """Mark each test's ``xdist_group`` and sort: every worker must compute the same order, so
    this depends on the collected items alone."""
    for item in items:
        group = group_of(item)
        if group is not None and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=rank)  # stable: collection order within a rank
