"""Podman for the image tests (tests/deploy): build the images from a local base, run them.

No Docker engine runs on these machines and no registry is reachable, but Debian's podman + runc
run images, and ``scripts/base-image.sh`` makes the Python base from the machine's own apt mirrors
(mmdebstrap, then ``podman import``). Every Dockerfile takes that base through its
``PYTHON_IMAGE`` build argument; builds use the host's network, so apt and pip inside reach what
the machine reaches. Everything else runs in the container tests' own network namespace
(tests/support/netns.py), out of the other tests' sight. Podman's layer cache keeps the images
between runs: a second session only checks that nothing changed.

Podman reads tests/deploy/containers.conf (through ``CONTAINERS_CONF``): runc, and ulimits a
container may have here. Missing podman (or mmdebstrap), the tests are skipped on a developer's
machine and fail where containers are required (``CI`` or ``BUSSCRAPE_REQUIRE_CONTAINERS`` set),
where a skip would pass without having run them; ``scripts/bootstrap.sh test`` installs them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import netns

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tests" / "deploy" / "containers.conf"
BASE = "localhost/busscrape-base:bookworm"
TAG = "test"
# Image name -> its Dockerfile. The all-in-one image is "busscrape".
IMAGES = {name: ROOT / "services" / name / "Dockerfile" for name in ("busscrape", "dispatcher", "worker", "ingester")}
# What compose.yaml pulls and this machine cannot: nats and an S3 server (moto in MinIO's place).
STACK_IMAGES = {name: ROOT / "tests" / "deploy" / f"{name}.Dockerfile" for name in ("nats", "moto")}
REQUIRED_BY = ("CI", "BUSSCRAPE_REQUIRE_CONTAINERS")


def required(env: dict[str, str]) -> bool:
    return any(env.get(name, "").lower() not in ("", "0", "false", "no") for name in REQUIRED_BY)


def missing() -> str | None:
    """Why the image tests cannot run here, or None."""
    for tool in ("podman", "mmdebstrap", "runc", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def unavailable(reason: str, env: dict[str, str]) -> None:
    """Skip, or fail when this run requires containers."""
    if required(env):
        pytest.fail(f"containers are required in this run (CI or BUSSCRAPE_REQUIRE_CONTAINERS) but {reason}; "
                    "scripts/bootstrap.sh test installs podman, runc, mmdebstrap and iproute2", pytrace=False)
    pytest.skip(f"{reason} (scripts/bootstrap.sh test installs podman, runc, mmdebstrap and iproute2)")


def environment() -> dict[str, str]:
    """The environment podman (and podman-compose) run with: this configuration, no BUSSCRAPE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    return {**env, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, timeout: float = 300, check: bool = True, cwd: Path = ROOT,
           nice: int = 0, host_network: bool = False) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``, in the calling thread's network namespace (the container tests' own,
    tests/support/netns.py) unless ``host_network`` (a build: apt and pip reach the registries);
    ``nice`` below 0 raises its priority (root only: elsewhere it runs at the usual one)."""
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                            env=environment(), cwd=cwd, preexec_fn=_preexec(nice, host_network))
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def _preexec(nice: int, host_network: bool) -> Callable[[], None] | None:
    if not nice and not host_network:
        return None

    def preexec() -> None:
        if host_network:
            netns.in_host_network()
        with contextlib.suppress(PermissionError):
            os.nice(nice)
    return preexec


def image(name: str) -> str:
    return f"localhost/busscrape-{name}:{TAG}" if name != "busscrape" else f"localhost/busscrape:{TAG}"


# What the compose stack and the Kubernetes pods run.
STACK = ("nats", "moto", "dispatcher", "worker", "ingester")
# The order builds go in: the role images first (their build stage is the all-in-one's too, so it
# is built once and its layers serve the rest), then the stack's own, then the all-in-one.
BUILD_ORDER = ("dispatcher", "worker", "ingester", "nats", "moto", "busscrape")
# Marks each image with the run that built it: xdist's run id is the same on every worker.
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
RUN_LABEL = "io.busscrape.test-run"
BUILD_NICE = -5  # the builds' priority: 3 times a test process's CPU share (Linux's CFS weights)


@dataclass
class Images:
    """The images of this run, each built at most once by whichever xdist worker asks first (the
    compose tests and the image tests run in groups of their own, side by side), and how long
    each took on this worker, waiting for another worker's build included (seconds; -rA prints
    them)."""

    timings: dict[str, float] = field(default_factory=dict)

    def build(self, *names: str) -> None:
        """The base (once per machine), then each image named that this run has not built yet,
        in BUILD_ORDER. A lock per image makes a second worker wait for the first one's build and
        take its result: two builds of the same steps at once would each do all the work."""
        self._locked("base", self._base)
        for name in sorted(names, key=BUILD_ORDER.index):
            self._locked(name, lambda n=name: self._image(n))

    def tag(self, name: str) -> str:
        """The image's tag, built by this run (first if need be)."""
        self.build(name)
        return image(name)

    def _locked(self, name: str, build: Callable[[], None]) -> None:
        if name in self.timings:
            return
        start = time.monotonic()
        with open(Path(tempfile.gettempdir()) / f"busscrape-test-image-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            build()
        self.timings[name] = time.monotonic() - start

    def _base(self) -> None:
        result = subprocess.run([str(ROOT / "scripts" / "base-image.sh"), BASE], capture_output=True, text=True,
                                timeout=1800, env=environment(), preexec_fn=_preexec(0, host_network=True))
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    def _image(self, name: str) -> None:
        label = podman("image", "inspect", "--format", f'{{{{index .Labels "{RUN_LABEL}"}}}}', image(name),
                       check=False).stdout.strip()
        if label == RUN:
            return  # another worker of this run built it
        dockerfile = {**IMAGES, **STACK_IMAGES}[name]
        # Ahead of the tests beside it: in a parallel run the builds are on the longest path (the
        # compose tests wait for them), and bound by CPU they took 550 s among six workers' tests
        # against ~190 s on a quiet machine.
        podman("build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={BASE}", "--label", f"{RUN_LABEL}={RUN}",
               "-f", str(dockerfile.relative_to(ROOT)), "-t", image(name), ".", timeout=1800, nice=BUILD_NICE,
               host_network=True)


# Run in the S3 container (moto's image has boto3): every archived page's URL and attempt (meta.json).
LIST_ARCHIVE = """
import boto3, json
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:9000", region_name="us-east-1",
                  aws_access_key_id="k", aws_secret_access_key="s")
pages = s3.get_paginator("list_objects_v2").paginate(Bucket="busscrape")
keys = [o["Key"] for p in pages for o in p.get("Contents", [])
        if o["Key"].endswith("/meta.json") and "/host=" in o["Key"]]
metas = [json.loads(s3.get_object(Bucket="busscrape", Key=k)["Body"].read()) for k in keys]
print(json.dumps({m["url"]: m["attempt"] for m in metas}))
"""


class Stack:
    """compose.yaml brought up with podman-compose, with tests/deploy/compose.podman.yaml on top
    (the third-party images built here, the site to crawl), as project ``busscrape-test``.

    podman 4.3 (Debian 12) has no ``healthy``/``completed`` conditions for ``depends_on`` and its
    ``--requires`` fails on a chain of them ("not found in input list"), so ``up`` starts each tier
    with ``--no-deps`` and waits where compose would: nats and S3 healthy, then ``minio-init`` and
    ``streams-apply`` exited 0, then the workers and the ingester.
    """

    PROJECT = "busscrape-test"
    FILES = (ROOT / "compose.yaml", ROOT / "tests" / "deploy" / "compose.podman.yaml")

    def __init__(self, workdir: Path, site_delay: float = 0.0) -> None:
        self.workdir = workdir
        self.env = {**environment(), "BUSSCRAPE_TAG": TAG, "SITE_DELAY": str(site_delay)}

    def compose(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [a for f in self.FILES for a in ("-f", str(f))]
        command = [podman_compose(), *files, "-p", self.PROJECT, *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                                env={**self.env, **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def container(self, service: str, n: int = 1) -> str:
        return f"{self.PROJECT}_{service}_{n}"

    def up(self, workers: int = 2) -> None:
        self.compose("up", "-d", "--no-deps", "nats", "minio", "site")
        for service in ("nats", "minio"):
            self.wait(lambda s=service: podman("healthcheck", "run", self.container(s), check=False).returncode == 0,
                       f"{service} healthy")
        self.compose("up", "-d", "--no-deps", "minio-init", "streams-apply")
        for service in ("minio-init", "streams-apply"):
            self.wait(lambda s=service: self._exited(s), f"{service} done")
            state = podman("inspect", "--format", "{{.State.ExitCode}}", self.container(service)).stdout.strip()
            assert state == "0", podman("logs", self.container(service), check=False).stderr[-3000:]
        self.compose("up", "-d", "--no-deps", "--scale", f"worker={workers}", "worker", "ingester")

    def discard(self) -> None:
        """Everything of the project gone at once, volumes included: what a test left, or the
        stack after the module's last test (no drain to wait for: nothing in it is kept)."""
        label = f"label=io.podman.compose.project={self.PROJECT}"
        left = podman("ps", "-a", "-q", "--filter", label).stdout.split()
        if left:
            podman("rm", "-f", "-t", "0", *left, timeout=300)
        self.down(volumes=True)

    def down(self, volumes: bool = False) -> None:
        self.compose("--profile", "dispatch", "down", *(["-v"] if volumes else []), timeout=600)
        # podman-compose's down knows one container per service: the scaled-out ones stay.
        label = f"label=io.podman.compose.project={self.PROJECT}"
        left = podman("ps", "-a", "-q", "--filter", label).stdout.split()
        if left:
            podman("rm", "-f", "-t", "45", *left, timeout=300)
        podman("pod", "rm", "-f", f"pod_{self.PROJECT}", check=False)  # the pod podman-compose made

    def dispatch(self, urls: list[str], name: str) -> subprocess.CompletedProcess[str]:
        """``compose run --rm dispatcher`` of a URL file (URLS_FILE)."""
        file = self.workdir / name
        file.write_text("\n".join(urls) + "\n")
        return self.compose("--profile", "dispatch", "run", "--rm", "--no-deps", "dispatcher",
                            env={"URLS_FILE": str(file)})

    def status(self) -> dict[str, Any]:
        """``busscrape status --json`` from the stack's admin image."""
        result = self.compose("run", "--rm", "--no-deps", "streams-apply", "status", "--json")
        return dict(json.loads(result.stdout.strip().splitlines()[-1]))

    def archived(self) -> dict[str, int]:
        """URL -> attempt of every page whose meta.json is in the stack's S3 bucket."""
        result = podman("exec", self.container("minio"), "python", "-c", LIST_ARCHIVE, timeout=120)
        return dict(json.loads(result.stdout))

    def wait_archived(self, urls: set[str], at_least: int | None = None, timeout: float = 300,
                      seen: frozenset[str] = frozenset()) -> dict[str, int]:
        """Wait until ``at_least`` (default: all) of the URLs are in S3, counting those in ``seen``
        (archived before, e.g. in an S3 server since replaced); URL -> attempt of those in S3 now."""
        found: dict[str, int] = {}
        wanted = len(urls) if at_least is None else at_least

        def done() -> bool:
            nonlocal found
            found = {u: a for u, a in self.archived().items() if u in urls}
            return len(found.keys() | (seen & urls)) >= wanted

        self.wait(done, f"{wanted} of {len(urls)} pages archived", timeout, every=2.0)
        return found

    def _exited(self, service: str) -> bool:
        state = podman("inspect", "--format", "{{.State.Status}}", self.container(service), check=False)
        return state.stdout.strip() in ("exited", "stopped")

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 180, every: float = 1.0) -> None:
        wait_until(condition, what, timeout, every, logs_of=(self.container("worker"), self.container("ingester")))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 180, every: float = 1.0,
               logs_of: tuple[str, ...] = ()) -> None:
    """Poll ``condition``; fail after ``timeout`` seconds with the tails of these containers' logs."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = {c: podman("logs", "--tail", "20", c, check=False).stderr[-1500:] for c in logs_of}
            raise AssertionError(f"not {what} within {timeout:.0f}s; logs: {logs}")
        time.sleep(every)


def podman_compose() -> str:
    """podman-compose 1.1 or newer: the test extra's (beside this Python), else PATH's."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    found = shutil.which("podman-compose", path=path)
    assert found, "podman-compose is missing: install the test extra (podman-compose>=1.1)"
    return found
