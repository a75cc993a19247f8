"""compose.yaml brought up for real with podman-compose (tests/support/containers.py, ``Stack``).

The stack as compose.yaml declares it: nats, the S3 server (moto in MinIO's place, an image built
here, as is nats'), streams-apply, two workers, an ingester; URLs queued by ``compose run
dispatcher``; every page checked in the bucket. Pages come from a site on the stack's bus network
(tests/deploy/site.py) that answers after 2 s, so a worker can be killed, or the stack taken down,
while pages are in flight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.support.containers import STACK, Images, Stack, podman

# The first test also waits for the stack's image builds (minutes on a fresh podman store). A
# group of its own: the stack holds ports 4222, 8222 and 9000 (in the container tests' network
# namespace, tests/support/netns.py) for minutes, beside the images' tests.
pytestmark = [pytest.mark.slow, pytest.mark.containers("compose"), pytest.mark.timeout(1800)]


def urls(prefix: str, count: int) -> list[str]:
    return [f"http://site:8080/{prefix}/{n}.html" for n in range(count)]


@pytest.fixture(scope="module")
def stack(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    images.build(*STACK)
    stack = Stack(tmp_path_factory.mktemp("compose"), site_delay=2.0)
    stack.discard()  # whatever an interrupted run left
    stack.up(workers=2)
    yield stack
    stack.discard()


def running(stack: Stack, service: str) -> list[str]:
    names = podman("ps", "--filter", f"name={stack.PROJECT}_{service}_", "--format", "{{.Names}}").stdout.split()
    return sorted(names)


def test_the_stack_runs_two_workers_and_archives_every_dispatched_page(stack: Stack) -> None:
    assert running(stack, "worker") == [stack.container("worker", 1), stack.container("worker", 2)]
    assert running(stack, "ingester") == [stack.container("ingester")]
    wanted = urls("all", 30)

    queued = stack.dispatch(wanted, "all.txt")

    assert "published" in queued.stdout
    archived = stack.wait_archived(set(wanted))
    assert set(archived) == set(wanted)  # (a retry, under load, is allowed: a second attempt, same keys)
    assert stack.status()["deadletters"]["total"] == 0


def started_by(stack: Stack, container: str, prefix: str) -> set[str]:
    """The pages of ``prefix`` the site saw this container ask for (site.py logs each on arrival)."""
    address = podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                     container).stdout.strip()
    lines = podman("logs", stack.container("site")).stdout.splitlines()
    return {f"http://site:8080{path}" for _, ip, path in (line.split(" ", 2) for line in lines
            if line.startswith("start ")) if ip == address and path.startswith(f"/{prefix}/")}


# A worker's log event about a task (task.done, task.retry, task.outage, ...): the URL in it has
# left that worker's hands. structlog writes one flat JSON object per event.
TASK_EVENT = re.compile(r'\{[^{}]*"event": "task\.[a-z_]+"[^{}]*\}')


def ended_by(container: str) -> set[str]:
    """The URLs this worker container has logged an outcome for (any attempt)."""
    logs = podman("logs", container)
    events = (json.loads(m.group()) for m in TASK_EVENT.finditer(logs.stdout + logs.stderr))
    return {e["url"] for e in events if "url" in e}


def test_a_worker_killed_mid_run_loses_nothing(stack: Stack) -> None:
    wanted = set(urls("kill", 40))
    victim = stack.container("worker", 1)
    stack.dispatch(sorted(wanted), "kill.txt")
    # The site answers after 2 s: kill the worker while pages it asked for are still loading.
    in_flight: set[str] = set()

    def victim_is_rendering() -> bool:
        # Two `podman logs`, site's first: a page counted here was asked for before the first read
        # and had no outcome at the second, so it was in flight all that while. (Listing the bucket
        # instead, a Python started in the S3 container, could outlast a 2-s page under load, and
        # every page seen started was archived by the time the list came back.)
        nonlocal in_flight
        started = started_by(stack, victim, "kill")
        in_flight = started - ended_by(victim)
        return bool(in_flight)

    stack.wait(victim_is_rendering, "the worker to kill rendering a page", timeout=120, every=0.2)

    podman("kill", "--signal", "KILL", victim)

    archived = stack.wait_archived(wanted, timeout=300)  # its tasks come back after ack_wait (15s)
    assert set(archived) == wanted
    assert in_flight <= set(archived)  # including the pages it was rendering when killed
    assert stack.status()["deadletters"]["total"] == 0
    if victim not in running(stack, "worker"):  # compose would restart it
        podman("start", victim)


def test_down_and_up_again_resumes_the_queue(stack: Stack) -> None:
    wanted = set(urls("resume", 40))
    stack.dispatch(sorted(wanted), "resume.txt")
    stack.wait_archived(wanted, at_least=4)
    # The daemons drain and stop; what the S3 server holds now is counted, since moto keeps its
    # objects in memory and does not outlive `down` (MinIO would).
    stack.compose("stop", "worker", "ingester", timeout=300)
    before = frozenset(stack.archived()) & wanted
    assert 0 < len(before) < len(wanted), "nothing left in the queue to resume"

    stack.down()  # the volumes stay: nats' store keeps TASKS
    stack.up(workers=2)

    after = stack.wait_archived(wanted, seen=before, timeout=300)
    assert wanted - before <= set(after), "pages queued before down were not archived after up"
    assert stack.status()["deadletters"]["total"] == 0
