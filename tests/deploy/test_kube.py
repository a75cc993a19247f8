"""The Kubernetes manifests run as pods with ``podman kube play`` (services/*/k8s).

podman 4.3 plays Pods and Deployments (a ConfigMap as an env source, ``fieldRef`` env, emptyDir
volumes, Secrets from podman secrets) but not a StatefulSet, a Job or a Service, and its probes
need curl in the image. So here nats (the StatefulSet's
place) and an S3 server (moto) run as plain containers on one network, named as the Services
are; ``streams apply`` runs as the Job would; then the worker and ingester Deployments are played
as written, with services/config.yaml as their ConfigMap and the Secret from secrets.example.yaml
(busscrape-s3) as a podman secret, their image set as ``kustomize edit set image`` would. Each
pod must come up, answer its probes' paths, and see the env and volumes its manifest gives it;
then pages queued by the dispatcher are rendered and archived by them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.containers import BASE, LIST_ARCHIVE, ROOT, STACK, Images, podman, wait_until
from tests.support.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.containers, pytest.mark.timeout(1800)]

NETWORK = "busscrape-kube-test"
SERVICES = ROOT / "services"
CONFIG = SERVICES / "config.yaml"
DEPLOYMENTS = {"worker": SERVICES / "worker" / "k8s" / "deployment.yaml",
               "ingester": SERVICES / "ingester" / "k8s" / "deployment.yaml"}
SITE = ROOT / "tests" / "deploy" / "site.py"


def config_env() -> dict[str, str]:
    return dict(yaml.safe_load(CONFIG.read_text())["data"])


def played(name: str, images: Images, folder: Path) -> Path:
    """The Deployment as written, its image set to the one built here (kustomize's `images:`), the
    site's address opened to pages (busscrape refuses private addresses by default), one replica."""
    doc = yaml.safe_load(DEPLOYMENTS[name].read_text())
    container = doc["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"busscrape-{name}"
    container["image"] = images.tag(name)
    if name == "worker":
        container["env"].append({"name": "BUSSCRAPE_NETWORK__ALLOW", "value": "site:8080"})
    # podman 4.3 publishes every containerPort on the host (9464 for both Deployments, and again
    # for each replica): one pod each, on a free loopback port.
    doc["spec"]["replicas"] = 1
    for port in container.get("ports", []):
        port.update(hostIP="127.0.0.1", hostPort=free_port())
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def pod_container(name: str) -> str:
    """The container kube play made for the Deployment busscrape-NAME (pod busscrape-NAME-pod-0)."""
    names = podman("ps", "--filter", f"pod=busscrape-{name}-pod-0", "--format", "{{.Names}}").stdout.split()
    ours = [n for n in names if not n.endswith("-infra")]
    assert len(ours) == 1, names
    return ours[0]


def remove_all() -> None:
    for name in DEPLOYMENTS:
        podman("pod", "rm", "-f", "-t", "5", f"busscrape-{name}-pod-0", check=False)
    podman("rm", "-f", "-t", "5", "nats", "minio", "site", check=False)
    podman("secret", "rm", "busscrape-s3", "busscrape-nats-files", check=False)
    podman("network", "rm", "-f", NETWORK, check=False)


@pytest.fixture(scope="module")
def kube(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    images.build(*STACK)
    folder = tmp_path_factory.mktemp("kube")
    remove_all()
    podman("network", "create", NETWORK)
    net = ["--network", NETWORK]
    podman("run", "-d", "--name", "nats", *net, images.tag("nats"),
           "--jetstream", "--store_dir", "/data", "--http_port", "8222")
    podman("run", "-d", "--name", "minio", *net, images.tag("moto"))
    podman("run", "-d", "--name", "site", *net, "-e", "SITE_DELAY=0", "-v", f"{SITE}:/srv/site.py:ro",
           BASE, "python", "/srv/site.py")
    keys = {"BUSSCRAPE_S3__ACCESS_KEY": "kube-key", "BUSSCRAPE_S3__SECRET_KEY": "kube-secret"}
    # A podman secret holding the Secret's data as JSON, key -> base64 (what podman 4.3's kube play reads).
    secret = folder / "busscrape-s3.json"
    secret.write_text(json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}))
    podman("secret", "create", "busscrape-s3", str(secret))
    # podman 4.3 ignores `optional: true` on a secret volume: the NATS files Secret (none here,
    # NATS has no auth) must exist; it holds one file nothing reads.
    files = folder / "busscrape-nats-files.json"
    files.write_text(json.dumps({"README": base64.b64encode(b"no NATS credentials").decode()}))
    podman("secret", "create", "busscrape-nats-files", str(files))
    env = [a for k, v in config_env().items() for a in ("-e", f"{k}={v}")]
    wait_until(lambda: podman("run", "--rm", *net, *env, images.tag("dispatcher"), "streams", "apply",
                              check=False).returncode == 0, "streams applied (the Job's part)", timeout=120)
    wait_until(lambda: podman("exec", "minio", "python", "-c", MAKE_BUCKET, check=False).returncode == 0,
               "the bucket made", timeout=120)
    for name in DEPLOYMENTS:
        podman("kube", "play", *net, "--configmap", str(CONFIG), str(played(name, images, folder)), timeout=300)
    yield {"net": net, "env": env, "folder": folder}
    remove_all()


MAKE_BUCKET = """
import boto3
boto3.client("s3", endpoint_url="http://127.0.0.1:9000", region_name="us-east-1",
             aws_access_key_id="k", aws_secret_access_key="s").create_bucket(Bucket="busscrape")
"""

# GET a probe's path inside the pod, as the kubelet would.
PROBE = """
import sys, urllib.request as u
try:
    print(u.urlopen(sys.argv[1], timeout=5).status)
except Exception as e:
    print(e); sys.exit(1)
"""


def probe_url(container: dict[str, Any], probe: dict[str, Any]) -> str:
    port = probe["httpGet"]["port"]
    if isinstance(port, str):  # a named port: the container's ports must declare it
        port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
    return f"http://127.0.0.1:{port}{probe['httpGet']['path']}"


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_each_deployment_runs_as_a_pod_with_its_env_probes_and_volumes(kube: dict[str, Any], name: str) -> None:
    container = pod_container(name)
    manifest = yaml.safe_load(DEPLOYMENTS[name].read_text())["spec"]["template"]["spec"]
    spec = manifest["containers"][0]
    # Every probe's path answers on its port. (podman 4.3 turns an httpGet liveness probe into a
    # healthcheck that runs curl, which the images lack, against port 0 for a named port: so the
    # probes are checked here as the kubelet makes them, not through `podman healthcheck run`.)
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        url = probe_url(spec, spec[kind])
        wait_until(lambda u=url: podman("exec", container, "python", "-c", PROBE, u, check=False).returncode == 0,
                   f"{name}: {kind} {url} answering 200", timeout=180, logs_of=(container,))
    inspect = json.loads(podman("inspect", container).stdout)[0]
    env = dict(e.split("=", 1) for e in inspect["Config"]["Env"])
    assert {k: env.get(k) for k in config_env()} == config_env()  # envFrom: the ConfigMap
    for var in spec.get("env", []):
        if "value" in var:
            assert env[var["name"]] == var["value"], var["name"]
    if name == "ingester":
        assert env["BUSSCRAPE_S3__ACCESS_KEY"] == "kube-key"  # envFrom: the Secret
    whoami = podman("exec", container, "id", "-u").stdout.strip()
    assert whoami == str(manifest["securityContext"]["runAsUser"])
    mounts = {m["Destination"] for m in inspect["Mounts"]}
    for mount in spec["volumeMounts"]:
        volume = next(v for v in manifest["volumes"] if v["name"] == mount["name"])
        if "emptyDir" in volume:
            assert mount["mountPath"] in mounts, mount
            podman("exec", container, "touch", f"{mount['mountPath']}/written")


def test_the_pods_render_and_archive_what_is_dispatched(kube: dict[str, Any], images: Images) -> None:
    urls = [f"http://site:8080/kube/{n}.html" for n in range(10)]
    (kube["folder"] / "urls.txt").write_text("\n".join(urls) + "\n")
    podman("run", "--rm", *kube["net"], *kube["env"], "-v", f"{kube['folder'] / 'urls.txt'}:/input/urls.txt:ro",
           images.tag("dispatcher"), "dispatch", "--no-progress", "/input/urls.txt", timeout=120)

    def archived() -> set[str]:
        result = podman("exec", "minio", "python", "-c", LIST_ARCHIVE, check=False)
        return set(json.loads(result.stdout)) if result.returncode == 0 else set()

    wait_until(lambda: set(urls) <= archived(), "10 pages archived by the pods", timeout=300)

