"""Reading deploy/ the way Docker Compose and Kustomize do, and checking commands with the real CLI.

Shared by the tests in this package. Example::

    compose = load_compose()           # YAML merge keys applied, ${VAR:-default} filled in
    parse_switchyard(compose["services"]["sim-0"]["command"])   # the real argparse parsers
    render_overlay("dev")              # `kubectl kustomize`, as a list of resources
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from backends.sim import cli as sim_cli
from backends.worker import cli as worker_cli
from gateway.cli import commands as gateway_cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "switchyard.json"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod")

# Services test_compose_native.py does not start: the CUDA worker needs a GPU (its command is
# still parsed with the real CLI, like every other).
NOT_STARTED_NATIVELY: tuple[str, ...] = ("pytorch-worker-gpu",)

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def interpolate(value: Any, environ: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` / ``${VAR-default}`` substitution, recursively."""
    if isinstance(value, str):
        def substitute(match: re.Match[str]) -> str:
            name, operator, default = match.groups()
            if name in environ and (environ[name] or operator != ":-"):
                return environ[name]
            return default or ""

        return _INTERPOLATION.sub(substitute, value).replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(item, environ) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, environ) for key, item in value.items()}
    return value


def load_compose(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file as Compose sees it with an empty environment (the defaults)."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())  # SafeLoader applies `<<` merge keys
    assert isinstance(raw, dict), "the compose file must be a mapping"
    return dict(interpolate(raw, environ or {}))


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(key): str(value) for key, value in env.items()}


def bind_mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each bind mount (relative to the compose file)."""
    mounts = {}
    for volume in service.get("volumes") or []:
        source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE_FILE.parent / source).resolve()
    return mounts


def host_path(service: Mapping[str, Any], container_path: str) -> Path:
    """Where a file the container reads comes from: a bind mount of it or of a folder above."""
    for target, source in bind_mounts(service).items():
        if container_path == target:
            return source
        if container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target.rstrip("/")) + 1:]
    raise AssertionError(f"{container_path} is not mounted from deploy/ in this service")


def _parse(parser: argparse.ArgumentParser, argv: list[str], what: str) -> argparse.Namespace:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        raise AssertionError(f"{what} rejects {argv}: {stderr.getvalue().strip()}") from None


def parse_switchyard(argv: list[str]) -> argparse.Namespace:
    """Parse ``switchyard <argv>`` with the parser the real command uses; AssertionError if not."""
    assert argv, "an empty command"
    if argv[0] == "sim":
        args = _parse(sim_cli.build_parser(), argv[1:], "switchyard sim")
        sim_cli.config_from_args(args)  # the values too (a profile field out of range, ...)
        return args
    if argv[0] == "worker":
        return _parse(worker_cli.build_parser(), argv[1:], "switchyard worker")
    return _parse(gateway_cli.build_parser(), argv, "switchyard")


def option(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def dashboard_metric_names(path: Path | None = None) -> set[str]:
    """Every metric name in the Grafana dashboard's queries."""
    path = path or DASHBOARD
    panels = json.loads(path.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    return {name for expr in exprs
            for name in re.findall(r"\b(?:switchyard_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr)}


def kubectl() -> str:
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("kubectl") or shutil.which("kubectl", path=venv_bin)
    assert found, "kubectl (for `kubectl kustomize`) is missing: run scripts/setup.sh"
    return found


def render(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize PATH``: every resource the overlay would apply."""
    result = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_overlay(overlay: str) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / overlay)


def of_kind(resources: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] == kind]


def named(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [r for r in of_kind(resources, kind) if r["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str], *,
            is_plain_map: bool = False) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions), or with ``is_plain_map`` a
    Service's plain ``selector`` map, selects pods with these labels. None selects nothing."""
    if selector is None:
        return False
    match_labels = selector if is_plain_map else selector.get("matchLabels", {})
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expression in [] if is_plain_map else selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        is_match = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
                    "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not is_match:
            return False
    return True


def workloads(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def pod_labels(workload: Mapping[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def containers(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"]["template"]["spec"]["containers"])
