"""A three-node JetStream cluster on loopback: real nats-server processes, each its own store.

Nodes talk over ``--cluster`` / ``--routes`` on fixed loopback ports, so a node killed and
started again rejoins with the same name, ports and store, as a crashed server would.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import orjson

from busscrape.ops.nats_server import EmbeddedNatsServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsCluster:
    def __init__(self, workdir: Path, size: int = 3, name: str = "busscrape-test") -> None:
        self.routes = [free_port() for _ in range(size)]
        ports = [free_port() for _ in range(size)]
        self.nodes = []
        for i in range(size):
            others = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(self.routes) if j != i)
            self.nodes.append(EmbeddedNatsServer(
                workdir / f"node-{i}", name=f"node-{i}", port=ports[i],
                extra_args=("--cluster_name", name, "--cluster", f"nats://127.0.0.1:{self.routes[i]}",
                            "--routes", others)))

    @property
    def url(self) -> str:
        """Every node's URL: clients fail over between them."""
        return ",".join(f"nats://127.0.0.1:{node.port}" for node in self.nodes)

    def start(self, timeout: float = 60.0) -> NatsCluster:
        for node in self.nodes:
            node.start()
        self.wait_for_meta_leader(timeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def wait_for_meta_leader(self, timeout: float = 60.0) -> None:
        """Until the JetStream meta group has a leader that every running node knows."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = set()
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    with urllib.request.urlopen(f"{node.monitor_url}/jsz?leader-only=false", timeout=2) as resp:
                        doc = orjson.loads(resp.read())
                except OSError:
                    leaders.add(None)
                    continue
                leaders.add((doc.get("meta_cluster") or {}).get("leader"))
            if len(leaders) == 1 and None not in leaders:
                return
            time.sleep(0.25)
        raise TimeoutError("the JetStream cluster did not elect a meta leader")
