"""Network namespaces for the tests: the container tests' (podman's interfaces out of the other
tests' Chromium's sight), and one of a test's own where it changes the network on purpose.

Chromium watches the interfaces of its network namespace (netlink) and, when an address comes or
goes, fails the requests it has in flight with ``ERR_NETWORK_CHANGED``. The worker naks such a
delivery as an outage (as designed), which a test that counts deliveries or site hits exactly sees
as one too many. Every container on a podman bridge makes such changes on the host: the bridge's
address when its first container starts and when its last one stops, the link-local address of each
container's veth. Beside the container tests, that failed fresh clones (docs/development.md).

So the container tests (tests/deploy) run podman, their containers and the sites they serve in a
network namespace of the run's own: the controller (or the only test process) makes it, loopback up
and nothing else, and each test process moves its main thread into it for a container test module
and back after (``entered``). One namespace for all of them, not one per xdist worker: podman runs
a single aardvark-dns (the stacks' name server) for the machine, in the namespace of the container
that started it, so a second namespace's stack would resolve no name. The image builds reach the
package registries over the host's own network: they run in its namespace (``in_host_network``).

A test that changes the network itself (an address added under a page: tests/worker/
test_network_change.py) does so in a namespace of its own (``private``), with its nats-server, site
and worker's Chromium started inside, so nothing else on the machine sees the change.

Making a namespace needs root (as the container tests do here); elsewhere the container tests run
without one, as before, and the tests that need one of their own are skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLONE_NEWNET = 0x40000000
PREFIX = "busscrape-test-"
NETNS_DIR = Path("/run/netns")
_KEY = "container_netns"

# This process's own namespace, opened before any thread has left it: where builds run and where
# the main thread comes back to.
HOST = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    """Move the calling thread (and the processes and threads it starts from then on) into the
    network namespace ``fd`` refers to. (``os.setns`` is Python 3.12's.)"""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns into a network namespace: {os.strerror(errno)}")


def in_host_network() -> None:
    """A ``preexec_fn``: the child runs in the host's network namespace (an image build's apt and pip)."""
    setns(HOST)


def make(tag: str = "") -> Path | None:
    """A fresh named namespace of this process's (``tag`` tells several apart), loopback up; None
    where one cannot be made (not root, no ``ip``). Those of processes that were killed before they
    removed theirs are removed first."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None
    for stale in NETNS_DIR.glob(f"{PREFIX}*") if NETNS_DIR.is_dir() else ():
        pid = stale.name.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove(stale)
    name = f"{PREFIX}{os.getpid()}" + (f"-{tag}" if tag else "")
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return None
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True, check=True)
    return NETNS_DIR / name


def remove(path: Path) -> None:
    """Its name gone; the namespace itself goes with the last process (or open file) in it."""
    subprocess.run(["ip", "netns", "delete", path.name], capture_output=True, check=False)


@contextlib.contextmanager
def private(tag: str) -> Iterator[Path | None]:
    """A namespace of the block's own, the calling thread in it, removed after; None (and the host's
    network) where none can be made. What the block starts lives there: servers, Chromium, daemons."""
    path = make(tag)
    if path is None:
        yield None
        return
    try:
        with entered(path):
            yield path
    finally:
        remove(path)


@contextlib.contextmanager
def entered(path: Path) -> Iterator[None]:
    """The calling thread in the namespace at ``path`` for the block, then back in the host's."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd)
        try:
            yield
        finally:
            setns(HOST)
    finally:
        os.close(fd)


def of(config: pytest.Config) -> Path | None:
    """The run's container namespace: the controller's, passed to each xdist worker, or this
    process's own when it is the only one."""
    workerinput = getattr(config, "workerinput", None)
    value = workerinput.get(_KEY) if workerinput is not None else config.stash.get(_MADE, None)
    return Path(value) if value else None


_MADE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None:  # the controller, or the only test process
        path = make()
        if path is not None:
            config.stash[_MADE] = str(path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist, on the controller) Each worker is told the run's namespace."""
    node.workerinput[_KEY] = node.config.stash.get(_MADE, "")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE, None)
    if made:
        remove(Path(made))
