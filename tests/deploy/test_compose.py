"""deploy/docker-compose.yml: its structure, and every command, variable and file it hands to
switchyard checked against the real code (no Docker engine needed)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from opentelemetry import environment_variables as otel_api_variables
from opentelemetry.sdk import environment_variables as otel_sdk_variables

from gateway.cli import commands as gateway_cli
from gateway.observe.tracing import tracing_from_env
from gateway.settings import ENV_PREFIX, load_settings
from tests.deploy.compose_schema import COMPOSE_SCHEMA
from tests.deploy.manifests import (
    COMPOSE_FILE,
    DEPLOY,
    ROOT,
    bind_mounts,
    dashboard_metric_names,
    environment,
    host_path,
    interpolate,
    load_compose,
    option,
    parse_switchyard,
)

COMPOSE = load_compose()
COMPOSE_VALIDATOR = jsonschema.Draft202012Validator(COMPOSE_SCHEMA)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
SWITCHYARD_IMAGES = ("switchyard-gateway", "switchyard-worker-cpu", "switchyard-worker-cuda")
OURS = sorted(name for name, s in SERVICES.items() if s["image"].split(":")[0] in SWITCHYARD_IMAGES)
# Service keys of the compose specification that this file may use; a typo fails here.
SERVICE_KEYS = frozenset({
    "build", "command", "deploy", "depends_on", "entrypoint", "environment", "expose",
    "healthcheck", "image", "ports", "profiles", "restart", "stop_grace_period", "volumes",
})
# Images whose Dockerfile declares a HEALTHCHECK (so `service_healthy` can wait on them).
# The OpenTelemetry SDK's variable names (the gateway and the workers configure tracing by them).
OTEL_VARIABLES = frozenset(
    value for module in (otel_api_variables, otel_sdk_variables)
    for name, value in vars(module).items() if name.startswith("OTEL_") and isinstance(value, str))
IMAGE_HEALTHCHECKS = {"switchyard-gateway", "switchyard-worker-cpu", "switchyard-worker-cuda"}


def test_top_level_and_service_keys_are_compose_keys() -> None:
    assert {k for k in COMPOSE if not k.startswith("x-")} <= {"name", "services", "volumes"}
    for name, service in SERVICES.items():
        unknown = set(service) - SERVICE_KEYS
        assert not unknown, f"service {name}: unknown keys {unknown}"
        assert "image" in service, f"service {name}: name its image"
        assert service.get("restart", "no") in ("no", "always", "on-failure", "unless-stopped")


def _schema_errors(document: Any) -> list[str]:
    """Where ``document`` breaks our Compose Specification schema, one line per error."""
    return sorted(f"{'/'.join(map(str, error.absolute_path)) or '(top level)'}: {error.message}"
                  for error in COMPOSE_VALIDATOR.iter_errors(document))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    return []


def test_the_file_matches_the_compose_specification() -> None:
    """The file fits the Compose Specification's fields, both as written and with the variables
    filled in; the project name and the ``${VAR:-default}`` forms are checked here (the schema
    says only that the name is a string)."""
    jsonschema.Draft202012Validator.check_schema(COMPOSE_SCHEMA)
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", COMPOSE["name"])
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    assert _schema_errors(raw) == []
    assert _schema_errors(COMPOSE) == []
    malformed = [s for s in _strings(raw) if "${" in interpolate(s.replace("$$", ""), {})]
    assert malformed == [], "not a ${VAR}, ${VAR:-default} or ${VAR-default} substitution"


def _set(document: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split("/")
    for key in parents:
        document = document[key]
    document[last] = value


@pytest.mark.parametrize(
    ("path", "value", "error_at"),
    [
        pytest.param("servcies", {}, "(top level)", id="unknown-top-level-key"),
        pytest.param("services/gateway/enviroment", {}, "services/gateway",
                     id="unknown-service-key"),
        pytest.param("services/nginx/ports", "127.0.0.1:8080:8080", "services/nginx/ports",
                     id="ports-not-a-list"),
        pytest.param("services/gateway/deploy/replicas", 2.5, "services/gateway/deploy/replicas",
                     id="replicas-not-an-integer"),
        pytest.param("services/gateway/depends_on/redis/condition", "service_ready",
                     "services/gateway/depends_on", id="unknown-depends-on-condition"),
        pytest.param("services/redis/healthcheck/interval", 2,
                     "services/redis/healthcheck/interval", id="interval-not-a-duration-string"),
        pytest.param("volumes/redis-data", ["a"], "volumes/redis-data", id="volume-not-a-mapping"),
    ],
)
def test_the_schema_rejects_a_broken_copy(path: str, value: Any, error_at: str) -> None:
    broken = copy.deepcopy(COMPOSE)
    _set(broken, path, value)
    errors = _schema_errors(broken)
    assert any(error.startswith(f"{error_at}: ") for error in errors), errors


def test_the_fleet_the_issue_asks_for() -> None:
    assert SERVICES["gateway"]["deploy"]["replicas"] >= 2
    sims = [name for name, s in SERVICES.items() if s.get("command", [None])[0] == "sim"]
    assert len(sims) == 4
    workers = {n: s for n, s in SERVICES.items() if s.get("command", [None])[0] == "worker"}
    cpu = [n for n, s in workers.items() if option(s["command"], "--device") == "cpu"]
    gpu = [n for n, s in workers.items() if option(s["command"], "--device") == "cuda"]
    assert len(cpu) == 1 and "profiles" not in SERVICES[cpu[0]], "one CPU worker, on by default"
    assert len(gpu) == 1 and SERVICES[gpu[0]]["profiles"] == ["gpu"]
    devices = SERVICES[gpu[0]]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    for name in ("redis", "nginx", "otel-collector", "jaeger", "prometheus", "grafana",
                 "demo-init"):
        assert name in SERVICES
    published = [name for name, s in SERVICES.items()
                 if any(p.endswith(":8080") for p in s.get("ports", []))]
    assert published == ["nginx"], "one published port for the gateways, on the proxy"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_references(name: str) -> None:
    service = SERVICES[name]
    for dependency, spec in (service.get("depends_on") or {}).items():
        assert dependency in SERVICES, f"{name} depends on an unknown service {dependency}"
        condition = spec["condition"]
        assert condition in ("service_started", "service_healthy",
                             "service_completed_successfully")
        if condition == "service_healthy":
            target = SERVICES[dependency]
            has_check = "healthcheck" in target and not target["healthcheck"].get("disable")
            assert has_check or target["image"].split(":")[0] in IMAGE_HEALTHCHECKS
    for target, source in bind_mounts(service).items():
        assert source.exists(), f"{name} mounts {source} at {target}: no such file"
        assert DEPLOY in source.parents, f"{name}: mount configuration from deploy/ only"
    for volume in service.get("volumes") or []:
        source = str(volume).split(":")[0]
        if not source.startswith((".", "/")):
            assert source in (COMPOSE.get("volumes") or {}), f"volume {source} not declared"
    for port in service.get("ports") or []:
        assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", port), f"{name}: publish on loopback only"
    if "build" in service:
        context = (COMPOSE_FILE.parent / service["build"]["context"]).resolve()
        assert context == ROOT and (context / service["build"]["dockerfile"]).is_file()
    image = service["image"]
    assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image} to a tag"
    check = service.get("healthcheck")
    if check and not check.get("disable"):
        assert check["test"][0] in ("CMD", "CMD-SHELL")


@pytest.mark.parametrize("name", [n for n in OURS if "command" in SERVICES[n]])
def test_commands_are_accepted_by_the_real_cli(name: str) -> None:
    parse_switchyard(SERVICES[name]["command"])


def test_gateway_config_and_environment_are_real_settings() -> None:
    gateway = SERVICES["gateway"]
    args = parse_switchyard(gateway["command"])
    config = host_path(gateway, args.config)
    assert gateway_cli.main(["config", "check", str(config)]) == 0
    env = environment(gateway)
    # Every SWITCHYARD_* variable must name a settings field (extra fields are refused).
    settings = load_settings(config, environ={k: v for k, v in env.items()
                                              if k.startswith(ENV_PREFIX)})
    assert settings.admin_token is not None and settings.key_secret is not None
    assert settings.listen.host == "0.0.0.0"
    assert settings.routing.discover_workers, "workers join through Redis heartbeats"
    assert not settings.backends
    stop_s = float(gateway["stop_grace_period"].rstrip("s"))
    assert settings.drain_timeout_s < stop_s, "compose kills the gateway before it drained"


@pytest.mark.parametrize("name", OURS)
def test_every_variable_is_read_by_something(name: str) -> None:
    """A variable nothing reads is a silent misconfiguration: each must be a gateway setting,
    an OpenTelemetry SDK variable switchyard honours, or a name the program it runs reads."""
    service = SERVICES[name]
    env = environment(service)
    otel = {k: v for k, v in env.items() if k.startswith("OTEL_")}
    assert set(otel) <= OTEL_VARIABLES, set(otel) - OTEL_VARIABLES
    if otel:
        tracing_from_env(otel)  # raises TelemetryConfigError on a value it cannot honour
    readers = [ROOT / "deploy/docker/healthcheck.py", ROOT / "gateway/cli/admin_client.py"]
    if "entrypoint" in service:
        readers.append(host_path(service, service["entrypoint"][-1]))
    is_gateway = service.get("command", [None])[0] == "serve"
    for variable in set(env) - set(otel):
        if is_gateway and variable.startswith(ENV_PREFIX):
            continue  # checked against the settings above
        assert any(variable in path.read_text() for path in readers), (
            f"{name}: nothing reads {variable}")


def test_init_service_uses_the_cli_variables() -> None:
    init = SERVICES["demo-init"]
    env = environment(init)
    script = host_path(init, init["entrypoint"][-1])
    assert init["entrypoint"][0] == "/bin/sh" and script.name == "init-demo.sh"
    assert "SWITCHYARD_URL" in env and "SWITCHYARD_ADMIN_TOKEN" in env  # what the CLI reads
    assert env["SWITCHYARD_ADMIN_TOKEN"] == environment(SERVICES["gateway"])[
        "SWITCHYARD_ADMIN_TOKEN"], "the init must use the gateways' admin token"
    assert re.fullmatch(r"http://nginx:8080", env["SWITCHYARD_URL"])
    for variable in re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", script.read_text()):
        assert variable in env or variable == "DEMO_READY_TIMEOUT_S", f"{variable} is not set"


def _listen_ports(name: str) -> set[int]:
    command = SERVICES[name].get("command", [])
    if command[:1] == ["sim"]:
        base, count = int(option(command, "--base-port")), int(option(command, "--workers"))
        return set(range(base, base + count))
    if command[:1] == ["worker"]:
        return {int(option(command, "--port"))}
    return set()


def test_sim_and_worker_addresses_are_their_service_names() -> None:
    """A worker advertises http://<--host>:<port> in its heartbeat; the gateways must reach it."""
    ids = set()
    for name, service in SERVICES.items():
        if service.get("command", [None])[0] in ("sim", "worker"):
            assert option(service["command"], "--host") == name
            assert option(service["command"], "--redis-url") == "redis://redis:6379/0"
            url = environment(service)["HEALTHCHECK_URL"]
            assert url == f"http://{name}:{min(_listen_ports(name))}/health"
            for port in _listen_ports(name):
                assert port not in ids or name.startswith("pytorch"), "sim ids come from ports"
                ids.add(port)


def test_prometheus_scrapes_what_compose_runs() -> None:
    prometheus = SERVICES["prometheus"]
    config = yaml.safe_load(host_path(prometheus, "/etc/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sd = jobs["switchyard-gateway"]["dns_sd_configs"][0]
    listen = load_settings(host_path(SERVICES["gateway"], "/etc/switchyard/switchyard.yaml"),
                           environ={}).listen
    assert sd["names"] == ["gateway"] and sd["port"] == listen.port
    groups = jobs["switchyard-workers"]["static_configs"]
    targets = {target for group in groups for target in group["targets"]}
    expected = {f"{name}:{port}" for name in SERVICES for port in _listen_ports(name)}
    assert targets == expected


def test_nginx_fronts_every_gateway_replica() -> None:
    nginx = SERVICES["nginx"]
    conf = host_path(nginx, "/etc/nginx/nginx.conf").read_text()
    port = load_settings(host_path(SERVICES["gateway"], "/etc/switchyard/switchyard.yaml"),
                         environ={}).listen.port
    assert re.search(rf"server gateway:{port} resolve", conf), "upstream = the gateway service"
    assert "resolver 127.0.0.11" in conf, "re-resolve the replicas through Docker's DNS"
    assert re.search(r"listen 8080;", conf) and nginx["ports"][0].endswith(":8080")
    assert "proxy_buffering off;" in conf, "SSE must not be buffered"
    assert "/nginx-health" in conf and "/nginx-health" in " ".join(nginx["healthcheck"]["test"])


def test_tracing_pipeline_is_wired() -> None:
    endpoint = environment(SERVICES["gateway"])["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint == "http://otel-collector:4318"
    collector = yaml.safe_load(host_path(SERVICES["otel-collector"],
                                         "/etc/otelcol/config.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    exporters = collector["service"]["pipelines"]["traces"]["exporters"]
    assert all(collector["exporters"][e]["endpoint"] == "jaeger:4317" for e in exporters)
    assert environment(SERVICES["jaeger"])["COLLECTOR_OTLP_ENABLED"] == "true"


def test_grafana_provisioning_matches_the_dashboard() -> None:
    grafana = SERVICES["grafana"]
    provisioning = host_path(grafana, "/etc/grafana/provisioning")
    sources = yaml.safe_load((provisioning / "datasources/datasources.yaml").read_text())
    prometheus = next(s for s in sources["datasources"] if s["type"] == "prometheus")
    assert prometheus["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards/dashboards.yaml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    dashboard_path = host_path(grafana, folder + "/switchyard.json")
    dashboard = json.loads(dashboard_path.read_text())
    home = environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path(grafana, home) == dashboard_path
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == prometheus["uid"] for p in panels)
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("ttft", "wait", "prefix-hit", "queue"):
        assert topic in titles, f"the dashboard needs a {topic} panel"


def test_dashboard_queries_name_metrics() -> None:
    names = dashboard_metric_names()
    assert "switchyard_ttft_seconds_bucket" in names
    assert "switchyard_e2e_duration_seconds_count" in names
    assert "switchyard_admission_queue_length" in names
    assert "vllm:prefix_cache_hits_total" in names
