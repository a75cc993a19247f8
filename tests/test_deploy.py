"""The deployment artifacts, validated offline: compose.yaml, the Dockerfiles, the Kubernetes and
KEDA manifests, and the Prometheus and Grafana files under services/.

Schemas first: the Compose Specification (as bundled by check-jsonschema), Kubernetes' own (as
bundled by kubernetes-validate, strict: unknown fields fail), KEDA's ScaledObject and
TriggerAuthentication CRDs (vendored in tests/schemas/keda, see its README), and hadolint for the
Dockerfiles. Then what no schema knows: every BUSSCRAPE_* variable is a real setting with a valid
value, every command given to a container parses, probes and scrape targets use the telemetry
port, stop timeouts exceed the drain grace periods, the KEDA trigger watches the workers'
consumer, credentials come from Secrets, and the dashboard queries only the metrics busscrape
exports. No network, no Docker engine, no cluster. The reading and parsing: tests/support/deploy.py.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema

from busscrape.bus import names
from busscrape.units import parse_duration
from tests.support.deploy import (
    DAEMONS,
    DASHBOARD,
    K8S_VERSIONS,
    KEDA_KINDS,
    KEDA_NATS_AUTH_PARAMS,
    METRICS,
    PROMETHEUS,
    ROOT,
    SCHEMAS,
    SERVICES,
    TARGET_LABELS,
    TASK_OUTCOMES,
    busscrape_containers,
    compose,
    compose_env,
    dockerfiles,
    dockerignored,
    docs_of,
    exec_form,
    final_stage,
    hadolint,
    image_env,
    instructions,
    interpolate,
    k8s_docs,
    k8s_env,
    k8s_files,
    keda_validator,
    make_test_pytest,
    parse_command,
    promql_metrics,
    settings_from,
    yaml_docs,
)

# --- compose ------------------------------------------------------------------------------------


def test_compose_matches_the_compose_spec() -> None:
    validator = jsonschema.Draft202012Validator(get_builtin_schema("vendor.compose-spec"))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_compose_runs_the_pipeline_in_order() -> None:
    services = compose()["services"]
    assert {"nats", "minio", "minio-init", "streams-apply", "worker", "ingester", "dispatcher",
            "prometheus", "grafana"} <= set(services)
    assert services["streams-apply"]["command"] == ["streams", "apply"]
    for name in ("worker", "ingester", "dispatcher"):
        depends = services[name]["depends_on"]
        assert depends["streams-apply"]["condition"] == "service_completed_successfully", name
        assert depends["nats"]["condition"] == "service_healthy", name
    assert services["ingester"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    # JetStream on a persistent volume, monitoring on 8222 (KEDA and `busscrape status` read /jsz).
    nats = services["nats"]
    assert "--jetstream" in nats["command"]
    assert nats["command"][nats["command"].index("--http_port") + 1] == "8222"
    store = nats["command"][nats["command"].index("--store_dir") + 1]
    assert any(v.split(":")[1] == store and v.split(":")[0] in compose()["volumes"] for v in nats["volumes"])
    assert "mc mb" in services["minio-init"]["command"][0]
    # One-shots run once (a restarting one never "completes"); daemons come back.
    for name, service in services.items():
        one_shot = name in {"minio-init", "streams-apply", "dispatcher"}
        assert service["restart"] == ("no" if one_shot else "unless-stopped"), name


def test_compose_worker_scales_and_profiles_split_the_extras() -> None:
    services = compose()["services"]
    # `docker compose up --scale worker=3` needs no fixed name and no host port.
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]
    assert services["dispatcher"]["profiles"] == ["dispatch"]
    assert services["prometheus"]["profiles"] == ["observability"]
    assert services["grafana"]["profiles"] == ["observability"]
    assert all("profiles" not in services[n] for n in ("nats", "minio", "streams-apply", "worker", "ingester"))
    (mount,) = services["dispatcher"]["volumes"]
    assert interpolate(mount["source"]) == "./urls.txt" and mount["target"] == "/input/urls.txt"
    assert mount["bind"]["create_host_path"] is False  # a missing file fails instead of becoming a folder


def test_compose_files_and_volumes_exist() -> None:
    doc = compose()
    for name, service in doc["services"].items():
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("./services"):
                assert (ROOT / source).exists(), f"{name}: {source}"
            elif not source.startswith(("./", "$", "/")):
                assert source in doc["volumes"], f"{name}: undeclared volume {source}"


def test_compose_third_party_images_are_pinned() -> None:
    for name, service in compose()["services"].items():
        image = service["image"]
        if image.startswith("busscrape-"):
            continue
        tag = image.rpartition(":")[2]
        assert ":" in image and tag and tag != "latest", f"{name}: pin {image}"


def test_compose_stop_grace_exceeds_the_drain() -> None:
    services = compose()["services"]
    for name, section in DAEMONS.items():
        grace = getattr(settings_from(compose_env(services[name]), f"compose {name}"), section).grace_period
        assert parse_duration(services[name]["stop_grace_period"]) > grace, name


# --- Kubernetes ---------------------------------------------------------------------------------


BUILTIN = [(w, d) for w, d in k8s_docs() if d["kind"] not in KEDA_KINDS and d["kind"] != "Kustomization"]


def test_every_manifest_is_validated_by_something() -> None:
    # Built-in kinds go to kubernetes-validate (a kind it has no schema for raises
    # SchemaNotFoundError there), KEDA's to the vendored CRDs, Kustomizations to the check below.
    kinds = {doc["kind"] for _, doc in k8s_docs()}
    assert {"Deployment", "CronJob", "Job", "ScaledObject", "TriggerAuthentication", "Kustomization"} <= kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("where", "doc"), BUILTIN, ids=[w for w, _ in BUILTIN])
def test_kubernetes_manifest_matches_its_schema(where: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{where} (Kubernetes {version}): {'.'.join(map(str, exc.path))}: {exc.message}")


KEDA = [(w, d) for w, d in k8s_docs() if d["kind"] in KEDA_KINDS]


@pytest.mark.parametrize(("where", "doc"), KEDA, ids=[w for w, _ in KEDA])
def test_keda_resource_matches_its_crd(where: str, doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "keda.sh/v1alpha1", where
    validator = keda_validator(doc["kind"])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == [], where
    if doc["kind"] == "ScaledObject":  # the CRD's CEL rule
        assert doc["spec"].get("minReplicaCount", 0) <= doc["spec"].get("maxReplicaCount", 100)


def test_the_validators_catch_mistakes() -> None:
    """A validator that accepts everything would make every test above pass: prove each refuses."""
    (_, deployment), *_ = docs_of("Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pth"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)

    (_, scaled), *_ = docs_of("ScaledObject")
    for mutate in (lambda s: s["spec"].update(maxReplicas=3),
                   lambda s: s["spec"]["triggers"][0].pop("type"),
                   lambda s: s["spec"]["triggers"][0]["metadata"].update(lagThreshold=20),
                   lambda s: s["spec"].update(minReplicaCount=-1),
                   lambda s: s["spec"]["fallback"].pop("replicas")):
        broken = copy.deepcopy(scaled)
        mutate(broken)
        assert list(keda_validator("ScaledObject").iter_errors(broken)), broken["spec"]

    broken = compose()
    broken["services"]["worker"]["stop_grace_periode"] = "45s"
    assert list(jsonschema.Draft202012Validator(get_builtin_schema("vendor.compose-spec")).iter_errors(broken))


def test_kustomizations_list_every_manifest() -> None:
    listed: set[Path] = set()
    for path in [SERVICES / "kustomization.yaml", *SERVICES.glob("*/k8s/kustomization.yaml")]:
        (doc,) = yaml_docs(path)
        assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and doc["kind"] == "Kustomization"
        assert set(doc) <= {"apiVersion", "kind", "namespace", "labels", "resources", "images"}, path
        for resource in doc["resources"]:
            target = path.parent / resource
            assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{path}: {resource}"
            listed.add(target.resolve())
        images = {i["name"] for i in doc.get("images", [])}
        assert images <= {c["image"] for _, _, c in busscrape_containers()}, path
    unlisted = [p for p in k8s_files() if p.resolve() not in listed and p.name != "kustomization.yaml"
                and not p.name.endswith(".example.yaml")]
    assert unlisted == []


def test_keda_scales_the_workers_on_their_consumer() -> None:
    (_, deployment), = [(w, d) for w, d in docs_of("Deployment") if d["metadata"]["name"] == "busscrape-worker"]
    assert "replicas" not in deployment["spec"], "KEDA owns the worker replica count"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    worker = settings_from(k8s_env(deployment, container), "worker Deployment")
    consumer = tomllib.loads((ROOT / "streams" / "workers.toml").read_text())
    auths = {d["metadata"]["name"]: (w, d) for w, d in docs_of("TriggerAuthentication")}
    for where, scaled in docs_of("ScaledObject"):
        spec = scaled["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": deployment["metadata"]["name"]}, where
        assert spec["minReplicaCount"] == 0 and "fallback" in spec, where
        # More workers than the consumer lets pull at once would only wait.
        assert spec["maxReplicaCount"] * worker.worker.concurrency <= worker.streams.worker_max_ack_pending, where
        assert spec["maxReplicaCount"] * worker.worker.concurrency <= consumer["max_waiting"], where
        (trigger,) = spec["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "nats-jetstream", where
        assert meta["stream"] == names.TASKS_STREAM and meta["consumer"] == names.WORKERS_CONSUMER, where
        assert int(meta["lagThreshold"]) > 0 and int(meta["activationLagThreshold"]) >= 0, where
        assert meta["useHttps"] in ("true", "false"), where
        params = dict(meta)
        if "authenticationRef" in trigger:
            auth_where, auth = auths[trigger["authenticationRef"]["name"]]
            secrets = {d["metadata"]["name"]: d for _, d in docs_of("Secret")}
            for ref in auth["spec"]["secretTargetRef"]:
                assert ref["parameter"] in KEDA_NATS_AUTH_PARAMS, auth_where
                params[ref["parameter"]] = secrets[ref["name"]]["stringData"][ref["key"]]
        assert params.get("account") or params.get("accountID"), where
        assert params["natsServerMonitoringEndpoint"].endswith(":8222"), where


def test_busscrape_settings_in_manifests_are_real() -> None:
    for where, doc, container in busscrape_containers():
        settings_from(k8s_env(doc, container), f"{where} {container['name']}")
    for where, doc in docs_of("Secret"):
        settings_from({k: v for k, v in doc.get("stringData", {}).items() if k.startswith("BUSSCRAPE_")}, where)
    for name, service in compose()["services"].items():
        settings_from(compose_env(service), f"compose {name}")
    for path in dockerfiles():
        settings_from(image_env(path), str(path.relative_to(ROOT)))


def test_credentials_come_from_secrets() -> None:
    secretive = re.compile(r"PASSWORD|TOKEN|SECRET|ACCESS_KEY|CREDS|NKEY|_KEY_FILE")
    for where, _, container in busscrape_containers():
        for item in container.get("env", []):
            assert not secretive.search(item["name"]) or "value" not in item, f"{where}: {item['name']} in plain env"
    for where, doc in docs_of("ConfigMap"):
        assert not [k for k in doc.get("data", {}) if secretive.search(k)], where
    for name, service in compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert not secretive.search(key) or "${" in str(value), f"compose {name}: {key} is written in the file"


def test_daemon_probes_ports_and_grace_match_the_settings() -> None:
    services = {d["metadata"]["name"]: d for _, d in docs_of("Service")}
    deployments = docs_of("Deployment")
    assert {d["metadata"]["name"] for _, d in deployments} == {f"busscrape-{n}" for n in DAEMONS}
    for where, doc in deployments:
        section = doc["metadata"]["name"].removeprefix("busscrape-")
        spec = doc["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        s = settings_from(k8s_env(doc, container), where)
        (port,) = container["ports"]
        assert port == {"name": "metrics", "containerPort": s.telemetry.http_port, "protocol": "TCP"}, where
        probes = {kind: container[f"{kind}Probe"]["httpGet"] for kind in ("startup", "liveness", "readiness")}
        assert probes["liveness"]["path"] == "/healthz" and probes["startup"]["path"] == "/healthz", where
        assert probes["readiness"]["path"] == "/readyz", where
        assert all(p["port"] in ("metrics", s.telemetry.http_port) for p in probes.values()), where
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(s.telemetry.http_port), where
        assert annotations["prometheus.io/path"] == "/metrics", where
        (service_port,) = services[doc["metadata"]["name"]]["spec"]["ports"]
        assert service_port["port"] == s.telemetry.http_port and service_port["targetPort"] == "metrics", where
        # SIGTERM drains for grace_period; the kubelet must not SIGKILL before.
        assert spec["terminationGracePeriodSeconds"] > getattr(s, section).grace_period, where
        # A verifiable non-root user, and the hardening Chromium's --no-sandbox relies on.
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0, where
        hardening = container["securityContext"]
        assert hardening["allowPrivilegeEscalation"] is False and hardening["capabilities"]["drop"] == ["ALL"], where
        assert container["resources"]["requests"] and container["resources"]["limits"], where


def test_compose_and_prometheus_agree_on_the_metrics_port() -> None:
    services = compose()["services"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name in DAEMONS:
        port = settings_from(compose_env(services[name]), f"compose {name}").telemetry.http_port
        (sd,) = jobs[f"busscrape-{name}"]["dns_sd_configs"]
        # DNS service discovery: one A record per replica of the compose service.
        assert sd == {"names": [name], "type": "A", "port": port, "refresh_interval": "15s"}
        assert name in services and "container_name" not in services[name]
    assert any(v.startswith(f"./{PROMETHEUS.relative_to(ROOT)}:") for v in services["prometheus"]["volumes"])


# --- Dockerfiles --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.parent.name)
def test_dockerfile_passes_hadolint(path: Path) -> None:
    result = subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.parent.name)
def test_dockerfile_builds_from_the_repository_as_non_root(path: Path) -> None:
    steps = instructions(path)
    args = {m[0]: m[1] for keyword, a in steps if keyword == "ARG" for m in [a.split("=", 1)] if len(m) == 2}
    stages = set()
    for keyword, a in steps:
        if keyword == "FROM":
            image, *alias = a.split(" AS ") if " AS " in a else a.split(" as ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            assert image in stages or (":" in image and not image.endswith(":latest")), f"{path}: pin {image}"
            stages |= {x.strip() for x in alias}
        elif keyword in ("COPY", "ADD"):
            assert keyword == "COPY", f"{path}: ADD"
            words = [w for w in a.split() if not w.startswith("--")]
            if "--from=" in a:
                continue
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"{path}: COPY {source} is not in the repository"
                assert not dockerignored(source), f"{path}: .dockerignore leaves {source} out of the context"
    final = dict(final_stage(path))
    user = final["USER"].split(":")
    assert all(u.isdigit() and int(u) > 0 for u in user), f"{path}: USER must be a numeric non-root uid"
    entrypoint, command = exec_form(final["ENTRYPOINT"]), exec_form(final["CMD"])
    assert entrypoint[-1] == "busscrape", path
    parse_command(command, str(path.relative_to(ROOT)))


def test_the_build_context_holds_what_the_wheel_needs() -> None:
    for needed in ("pyproject.toml", "README.md", "src/busscrape/__init__.py", "streams/tasks.toml"):
        assert not dockerignored(needed), needed
    for left_out in (".venv/bin/python", ".git/HEAD", ".busscrape/nats", "src/busscrape/__pycache__/x.pyc", "tests"):
        assert dockerignored(left_out), left_out


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.parent.name)
def test_dockerfile_build_stage_copies_what_the_wheel_force_includes(path: Path) -> None:
    # The wheel fails to build without them ("Forced include not found: /src/extractors").
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    steps = instructions(path)
    froms = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    build = steps[froms[0]:froms[1]]  # the first stage builds the wheel
    copied = {w.rstrip("/") for keyword, a in build if keyword == "COPY" for w in a.split()[:-1]}
    missing = set(hatch["force-include"]) - copied
    assert not missing, f"{path}: COPY {sorted(missing)} into the build stage"
    for source in hatch["force-include"]:
        assert not dockerignored(f"{source}/x"), source


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_daemon_images_check_health_on_the_telemetry_port(name: str) -> None:
    path = SERVICES / name / "Dockerfile"
    final = dict(final_stage(path))
    env = image_env(path)
    port = settings_from(env, str(path)).telemetry.http_port
    assert final["EXPOSE"] == str(port)
    healthcheck = exec_form(final["HEALTHCHECK"].partition(" CMD ")[2])
    assert healthcheck[:2] == ["python", "-c"] and "/healthz" in healthcheck[2]

    # Run the check itself: it passes against a /healthz that answers, fails when nothing listens.
    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
        up = {**clean, "BUSSCRAPE_TELEMETRY__HTTP_PORT": str(server.server_address[1])}
        assert subprocess.run([sys.executable, "-c", healthcheck[2]], env=up, timeout=30).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
    down = subprocess.run([sys.executable, "-c", healthcheck[2]], env=up, capture_output=True, timeout=30)
    assert down.returncode != 0


def test_worker_image_drives_debians_headless_shell_without_its_sandbox() -> None:
    env = image_env(SERVICES / "worker" / "Dockerfile")
    s = settings_from(env, "worker image")
    # The binary itself, not /usr/bin's wrapper script (which would leave a shell in between).
    assert str(s.browser.executable_path) == "/usr/lib/chromium/chromium-headless-shell"
    assert s.browser.no_sandbox is True and s.browser.headless
    steps = final_stage(SERVICES / "worker" / "Dockerfile")
    assert any(k == "RUN" and "apt-get install" in a and " chromium-headless-shell " in a for k, a in steps)


def test_deployments_point_the_browser_at_what_the_image_installs() -> None:
    # A path the image lacks stops every worker at start ("no Chromium found at …").
    image = image_env(SERVICES / "worker" / "Dockerfile")["BUSSCRAPE_BROWSER__EXECUTABLE_PATH"]
    seen = 0
    for where, _, container in busscrape_containers():
        for var in container.get("env", []):
            if var["name"] == "BUSSCRAPE_BROWSER__EXECUTABLE_PATH":
                assert var["value"] == image, f"{where}: {var['value']}, but the image has {image}"
                seen += 1
    for name, service in compose()["services"].items():
        value = (service.get("environment") or {}).get("BUSSCRAPE_BROWSER__EXECUTABLE_PATH")
        assert value in (None, image), f"compose {name}: {value}"
    assert seen <= 1


def test_container_commands_parse() -> None:
    for where, _, container in busscrape_containers():
        parse_command(container["args"], where)
    for name, service in compose()["services"].items():
        if service["image"].startswith("busscrape-") and "command" in service:
            parse_command(service["command"], f"compose {name}")
    with pytest.raises(pytest.fail.Exception):
        parse_command(["dispatch", "--no-such-flag", "/input/urls.txt"], "a wrong command")


# --- Prometheus and Grafana ---------------------------------------------------------------------

def test_promql_metric_extraction() -> None:
    expr = ('histogram_quantile(0.95, sum by (le) (rate(busscrape_render_duration_seconds_bucket'
            '{job="w", le!="+Inf"}[$__rate_interval]))) / on (instance) up')
    assert promql_metrics(expr) == {"busscrape_render_duration_seconds_bucket", "up"}


def dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_queries_only_busscrape_metrics() -> None:
    used: set[str] = set()
    for title, target in dashboard_targets():
        metrics = promql_metrics(target["expr"])
        assert metrics and metrics <= set(METRICS), f"{title}: {target['expr']}"
        used |= metrics
        labels = set().union(*(METRICS[n] for n in metrics)) | TARGET_LABELS
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", target["expr"]):
            assert {x.strip() for x in clause.split(",")} <= labels, f"{title}: {target['expr']}"
        for label, value in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', target["expr"]):
            assert label in labels, f"{title}: {target['expr']}"
            if label == "outcome":
                assert value in TASK_OUTCOMES, f"{title}: {target['expr']}"
            if label == "consumer":
                assert value in {names.WORKERS_CONSUMER, names.INGESTERS_CONSUMER}, f"{title}"
    # Every metric has a panel (the histogram through its buckets).
    assert {n for n in METRICS if not n.endswith(("_sum", "_count"))} <= used


def test_dashboard_is_a_provisionable_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]


def test_grafana_provisioning_matches_compose() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    provisioning = ROOT / "services/observability/grafana/provisioning"
    assert mounts[f"./{provisioning.relative_to(ROOT)}"] == "/etc/grafana/provisioning"
    (source,) = yaml_docs(provisioning / "datasources" / "prometheus.yaml")[0]["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose()["services"]
    (provider,) = yaml_docs(provisioning / "dashboards" / "busscrape.yaml")[0]["providers"]
    assert mounts[f"./{DASHBOARD.parent.relative_to(ROOT)}"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_vendored_schemas_stay_small() -> None:
    total = sum(p.stat().st_size for p in SCHEMAS.rglob("*") if p.is_file())
    assert total < 100_000, f"tests/schemas holds {total} bytes: vendor extracts, not dumps"


def _bytes(quantity: str) -> int:
    """A Kubernetes or compose memory quantity (``1Gi``, ``1G``, ``512M``) in bytes (compose's G is GiB)."""
    number, unit = re.fullmatch(r"(\d+)([KMGT]i?)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * 1024 ** ("KMGT".index(unit[0]) + 1 if unit else 0)


def test_nats_servers_get_a_memory_limit_and_gomemlimit_from_it() -> None:
    from busscrape.ops.nats_server import gomemlimit

    nats = compose()["services"]["nats"]
    assert nats["environment"]["GOMEMLIMIT"] == gomemlimit(_bytes(nats["deploy"]["resources"]["limits"]["memory"]))
    (_, statefulset), = [(w, d) for w, d in docs_of("StatefulSet") if d["metadata"]["name"] == "nats"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GOMEMLIMIT"] == gomemlimit(_bytes(container["resources"]["limits"]["memory"])) == "921MiB"


# --- The image tests' requirements (tests/deploy builds and runs the images with podman) ----------

@pytest.mark.parametrize(("env", "fails"), [({}, False), ({"CI": "0"}, False), ({"CI": "true"}, True),
                                            ({"BUSSCRAPE_REQUIRE_CONTAINERS": "1"}, True)])
def test_missing_podman_skips_outside_ci_and_fails_in_it(env: dict[str, str], fails: bool) -> None:
    from tests.support.containers import unavailable

    try:
        unavailable("podman is not installed", env)
    except BaseException as exc:  # pytest's outcomes are BaseExceptions: caught here, not acted on
        outcome = exc
    else:
        raise AssertionError("neither skipped nor failed")
    assert type(outcome) is (pytest.fail.Exception if fails else pytest.skip.Exception), outcome
    assert "podman is not installed" in str(outcome)


def test_make_test_requires_the_containers_and_bootstrap_installs_podman() -> None:
    variables, pytest_command = make_test_pytest()
    assert pytest_command.endswith(".venv/bin/python -m pytest"), pytest_command
    assert "BUSSCRAPE_REQUIRE_CONTAINERS=1" in variables.split()
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert re.search(r"apt-get install[^\n]* podman runc mmdebstrap", bootstrap)
