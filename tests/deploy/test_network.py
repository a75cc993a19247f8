"""The container tests' own network namespace (tests/support/netns.py): a container's bridge and
veth stay out of the host's namespace, where the other tests' Chromium watches the interfaces, and
a stack's names resolve in it (podman's one aardvark-dns serves it)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.support import netns
from tests.support.containers import BASE, Images, podman

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(600)]


def interfaces(host: bool) -> tuple[set[str], str]:
    """The names of the interfaces and the text of the addresses in the host's namespace, or in
    the calling thread's (the container tests' own)."""
    def ip(*args: str) -> str:
        return subprocess.run(["ip", "-o", *args], capture_output=True, text=True, check=True,
                              preexec_fn=netns.in_host_network if host else None).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in ip("link").splitlines()}, ip("addr")


def test_a_container_network_changes_no_interface_of_the_host(images: Images, pytestconfig: pytest.Config) -> None:
    if netns.of(pytestconfig) is None:
        pytest.skip("no network namespace for the container tests here (not root)")
    images.build()  # the base
    host_links, _ = interfaces(host=True)
    name = f"busscrape-netns-{uuid.uuid4().hex[:8]}"
    podman("network", "create", name)
    try:
        podman("run", "-d", "--name", name, "--network", name, BASE, "sleep", "120")
        gateway = json.loads(podman("network", "inspect", name).stdout)[0]["subnets"][0]["gateway"]
        address = json.loads(podman("inspect", name).stdout)[0]["NetworkSettings"]["Networks"][name]["IPAddress"]
        resolved = podman("run", "--rm", "--network", name, BASE, "python3", "-c",
                          f"import socket; print(socket.gethostbyname({name!r}))", timeout=120)
        assert resolved.stdout.strip() == address  # the stack's name server answers in this namespace

        links, addresses = interfaces(host=False)
        assert f" {gateway}/" in addresses and len(links) > 1  # the bridge and the veth, here ...
        now_links, now_addresses = interfaces(host=True)
        assert f" {gateway}/" not in now_addresses, now_addresses  # ... and not where Chromium looks
        assert now_links == host_links, now_links ^ host_links
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
        podman("network", "rm", "-f", name, check=False)
