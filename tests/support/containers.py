"""Podman for the image tests (tests/deploy): build the images from a local base, run them.

No Docker engine runs on these machines and no registry is reachable, but Debian's podman + runc
run images, and ``scripts/base-image.sh`` makes the Python base from the machine's own apt mirrors
(mmdebstrap, then ``podman import``). Every Dockerfile takes that base through its
``PYTHON_IMAGE`` build argument; builds use the host's network, so apt and pip inside reach what
the machine reaches. Podman's layer cache keeps the images between runs: a second session only
checks that nothing changed.

Podman reads tests/deploy/containers.conf (through ``CONTAINERS_CONF``): runc, and ulimits a
container may have here. Missing podman (or mmdebstrap), the tests are skipped on a developer's
machine and fail where containers are required (``CI`` or ``BUSSCRAPE_REQUIRE_CONTAINERS`` set),
where a skip would pass without having run them; ``scripts/bootstrap.sh test`` installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tests" / "deploy" / "containers.conf"
BASE = "localhost/busscrape-base:bookworm"
TAG = "test"
# Image name -> its Dockerfile. The all-in-one image is "busscrape".
IMAGES = {name: ROOT / "services" / name / "Dockerfile" for name in ("busscrape", "dispatcher", "worker", "ingester")}
REQUIRED_BY = ("CI", "BUSSCRAPE_REQUIRE_CONTAINERS")


def required(env: dict[str, str]) -> bool:
    return any(env.get(name, "").lower() not in ("", "0", "false", "no") for name in REQUIRED_BY)


def missing() -> str | None:
    """Why the image tests cannot run here, or None."""
    for tool in ("podman", "mmdebstrap", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def unavailable(reason: str, env: dict[str, str]) -> None:
    """Skip, or fail when this run requires containers."""
    if required(env):
        pytest.fail(f"containers are required in this run (CI or BUSSCRAPE_REQUIRE_CONTAINERS) but {reason}; "
                    "scripts/bootstrap.sh test installs podman, runc and mmdebstrap", pytrace=False)
    pytest.skip(f"{reason} (scripts/bootstrap.sh test installs podman, runc and mmdebstrap)")


def environment() -> dict[str, str]:
    """The environment podman (and podman-compose) run with: this configuration, no BUSSCRAPE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    return {**env, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, timeout: float = 300, check: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                            env=environment(), cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def image(name: str) -> str:
    return f"localhost/busscrape-{name}:{TAG}" if name != "busscrape" else f"localhost/busscrape:{TAG}"


@dataclass
class Images:
    """What the session built, and how long each step took (seconds; printed with -rA)."""

    timings: dict[str, float] = field(default_factory=dict)

    def tag(self, name: str) -> str:
        return image(name)


def build_all() -> Images:
    """The base (once per machine), then every image, one build at a time."""
    built = Images()
    start = time.monotonic()
    result = subprocess.run([str(ROOT / "scripts" / "base-image.sh"), BASE], capture_output=True, text=True,
                            timeout=1800, env=environment())
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    built.timings["base"] = time.monotonic() - start
    for name, dockerfile in IMAGES.items():
        start = time.monotonic()
        podman("build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={BASE}",
               "-f", str(dockerfile.relative_to(ROOT)), "-t", image(name), ".", timeout=1800)
        built.timings[name] = time.monotonic() - start
    return built
