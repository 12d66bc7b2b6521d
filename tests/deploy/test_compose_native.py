"""The compose fleet started natively, without containers, from deploy/docker-compose.yml.

Each switchyard service runs its compose command, environment and mounted configuration, with
only host names and ports rewritten to loopback: a private redis-server stands in for `redis`,
an OTLP receiver for `otel-collector`, and the first gateway replica for `nginx` (no proxy is
started). The demo init script runs as compose runs it, and its key must serve a chat
completion through each gateway replica. Third-party services (nginx, the collector, Jaeger,
Prometheus, Grafana) are checked structurally in test_compose.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)
from tests.deploy.manifests import (
    NOT_STARTED_NATIVELY,
    ROOT,
    dashboard_metric_names,
    environment,
    host_path,
    load_compose,
    option,
    parse_switchyard,
)
from tests.fleet import wait_until
from tests.telemetry.receiver import OtlpReceiver

THIRD_PARTY = ("nginx", "otel-collector", "jaeger", "prometheus", "grafana")
COMPOSE = load_compose()
SERVICES = COMPOSE["services"]
SIMS = sorted(n for n, s in SERVICES.items() if s.get("command", [None])[0] == "sim")
WORKERS = sorted(n for n, s in SERVICES.items() if s.get("command", [None])[0] == "worker"
                 and n not in NOT_STARTED_NATIVELY)


@dataclass
class NativeFleet:
    workdir: Path
    group: ProcessGroup
    receiver: OtlpReceiver
    addresses: dict[str, str] = field(default_factory=dict)  # "service:port" -> "127.0.0.1:port"
    gateway_urls: list[str] = field(default_factory=list)
    sim_urls: list[str] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    init_outputs: list[str] = field(default_factory=list)

    def rewrite(self, text: str) -> str:
        """Compose's service:port addresses -> the native processes' loopback ones."""
        for compose_address, native in self.addresses.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(compose_address)}(?!\d)", native, text)
        return text

    def native_command(self, service: str) -> list[str]:
        """The service's command with its listen address and ports moved to loopback."""
        argv = [self.rewrite(arg) for arg in SERVICES[service]["command"]]
        if "--host" in argv:
            argv[argv.index("--host") + 1] = "127.0.0.1"
        for flag in ("--base-port", "--port"):
            if flag in argv:
                index = argv.index(flag) + 1
                argv[index] = self.addresses[f"{service}:{argv[index]}"].split(":")[1]
        return argv

    def native_env(self, service: str) -> dict[str, str]:
        return {k: self.rewrite(v) for k, v in environment(SERVICES[service]).items()}

    def run_init(self) -> str:
        init = SERVICES["demo-init"]
        script = host_path(init, init["entrypoint"][-1])
        env = {**os.environ, **self.native_env("demo-init"), "DEMO_READY_TIMEOUT_S": "30",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        result = subprocess.run([*init["entrypoint"][:-1], str(script)], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"demo-init failed:\n{result.stdout}\n{result.stderr}"
        self.init_outputs.append(result.stdout)
        return result.stdout


def demo_key(output: str) -> str:
    match = re.search(r"demo key: (sy-[0-9a-f]{16}-\S{43})\s", output)
    assert match, f"no demo key in the init output:\n{output}"
    return match.group(1)


def exported_names(text: str) -> set[str]:
    """Sample names on a /metrics page, and those a declared family will have once it has a
    sample (a counter with no labelled value yet prints only its # TYPE line)."""
    suffixes = {"counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            names |= {family + suffix for suffix in suffixes.get(kind, ("",))}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def chat(base_url: str, key: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": environment(SERVICES["demo-init"])["DEMO_MODEL"],
                            "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hello there"}]})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeFleet]:
    workdir = tmp_path_factory.mktemp("compose-native")
    with ProcessGroup(log_dir=workdir) as group, OtlpReceiver() as receiver:
        native = NativeFleet(workdir, group, receiver)
        native.addresses["redis:6379"] = start_redis(group, workdir).split("//")[1].split("/")[0]
        native.addresses["otel-collector:4318"] = receiver.url.split("//")[1]
        for name in SIMS:
            command = SERVICES[name]["command"]
            base, count = int(option(command, "--base-port")), int(option(command, "--workers"))
            native_base = free_port_range(count)
            for offset in range(count):
                native.addresses[f"{name}:{base + offset}"] = f"127.0.0.1:{native_base + offset}"
            group.spawn(name, python_module_argv("gateway", *native.native_command(name)),
                        env=native.native_env(name))
            native.sim_urls += [f"http://127.0.0.1:{native_base + i}" for i in range(count)]
        for name in WORKERS:  # the PyTorch worker, on the CPU as compose runs it by default
            port = option(SERVICES[name]["command"], "--port")
            native.addresses[f"{name}:{port}"] = f"127.0.0.1:{free_port()}"
            group.spawn(name, python_module_argv("gateway", *native.native_command(name)),
                        env=native.native_env(name))
            native.worker_urls.append(f"http://{native.addresses[f'{name}:{port}']}")
        gateway = SERVICES["gateway"]
        # The mounted configuration, with its addresses (redis:6379) rewritten like the rest.
        config = workdir / "switchyard.yaml"
        mounted = host_path(gateway, option(gateway["command"], "--config")).read_text()
        config.write_text(native.rewrite(mounted))
        assert "redis:6379" in mounted and config.read_text() != mounted
        for replica in range(gateway["deploy"]["replicas"]):
            port = free_port()
            native.gateway_urls.append(f"http://127.0.0.1:{port}")
            argv = [arg if arg != option(gateway["command"], "--config") else str(config)
                    for arg in gateway["command"]]
            env = {**native.native_env("gateway"), "SWITCHYARD_LISTEN__HOST": "127.0.0.1",
                   "SWITCHYARD_LISTEN__PORT": str(port)}
            group.spawn(f"gateway-{replica}", python_module_argv("gateway", *argv), env=env)
        # No nginx natively: the init reaches the first replica where compose has the proxy.
        native.addresses["nginx:8080"] = native.gateway_urls[0].split("//")[1]
        native.addresses["gateway:8080"] = native.gateway_urls[0].split("//")[1]
        for url in native.sim_urls:
            wait_http(f"{url}/health", timeout_s=30, group=group)
        for url in native.worker_urls:  # loads the model and times a prefill first
            wait_http(f"{url}/health", timeout_s=90, group=group)
        for url in native.gateway_urls:
            wait_http(f"{url}/readyz", timeout_s=30, group=group)
        native.run_init()  # compose runs it once the proxy is healthy
        yield native


def test_every_service_is_started_natively_or_accounted_for() -> None:
    started = {"redis", "gateway", "demo-init", *SIMS, *WORKERS}
    assert WORKERS == ["pytorch-worker"]
    assert set(SERVICES) == started | set(THIRD_PARTY) | set(NOT_STARTED_NATIVELY)
    assert not started & (set(THIRD_PARTY) | set(NOT_STARTED_NATIVELY))
    for name in NOT_STARTED_NATIVELY:  # only the CUDA worker, behind the `gpu` profile
        assert SERVICES[name]["profiles"] == ["gpu"]
        assert option(SERVICES[name]["command"], "--device") == "cuda"
    assert not any(SERVICES[name]["image"].startswith("switchyard-") for name in THIRD_PARTY), (
        "a switchyard service must be started natively")


def test_demo_key_serves_a_chat_completion_through_each_replica(fleet: NativeFleet) -> None:
    output = fleet.init_outputs[0]
    assert "created tenant 'demo'" in output
    key = demo_key(output)
    for url in fleet.gateway_urls:  # tenants and keys are shared through Redis
        response = chat(url, key)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]


def test_init_can_run_again(fleet: NativeFleet) -> None:
    output = fleet.run_init()
    assert "tenant 'demo' already exists" in output
    key = demo_key(output)
    assert key != demo_key(fleet.init_outputs[0])
    assert chat(fleet.gateway_urls[-1], key).status_code == 200


def test_every_simulated_worker_joins_through_its_heartbeat(fleet: NativeFleet) -> None:
    admin_token = environment(SERVICES["gateway"])["SWITCHYARD_ADMIN_TOKEN"]

    def joined() -> set[str]:
        response = httpx.get(f"{fleet.gateway_urls[0]}/admin/fleet", timeout=5,
                             headers={"Authorization": f"Bearer {admin_token}"})
        return {b["url"] for b in response.json()["data"]
                if b["source"] == "heartbeat" and b["is_healthy"]}

    expected = {*fleet.sim_urls, *fleet.worker_urls}
    assert wait_until(lambda: joined() == expected, timeout_s=10), joined()


def test_dashboard_metrics_are_exported(fleet: NativeFleet) -> None:
    assert chat(fleet.gateway_urls[0], demo_key(fleet.init_outputs[-1])).status_code == 200
    exported = httpx.get(f"{fleet.gateway_urls[0]}/metrics", timeout=5).text
    exported += httpx.get(f"{fleet.sim_urls[0]}/metrics", timeout=5).text
    names = exported_names(exported)
    missing = dashboard_metric_names() - names
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_traces_reach_the_collector_address(fleet: NativeFleet) -> None:
    assert chat(fleet.gateway_urls[0], demo_key(fleet.init_outputs[-1])).status_code == 200
    receiver = fleet.receiver
    expected = {environment(SERVICES[name])["OTEL_SERVICE_NAME"] for name in ("gateway", SIMS[0])}
    spans = receiver.wait_for(lambda spans: expected <= {s.service for s in spans}, timeout_s=10)
    assert expected <= {s.service for s in spans}


def test_image_health_check_script(fleet: NativeFleet) -> None:
    script = ROOT / "deploy/docker/healthcheck.py"
    sim_env = fleet.native_env(SIMS[0])

    def check(env: dict[str, str]) -> int:
        return subprocess.run([sys.executable, str(script)], env={**os.environ, **env},
                              capture_output=True, timeout=10, check=False).returncode

    assert check({"HEALTHCHECK_URL": sim_env["HEALTHCHECK_URL"]}) == 0
    assert check({"HEALTHCHECK_URL": f"{fleet.gateway_urls[0]}/healthz"}) == 0
    assert check({"HEALTHCHECK_URL": f"http://127.0.0.1:{free_port()}/healthz"}) == 1
    assert check({"HEALTHCHECK_URL": f"{fleet.gateway_urls[0]}/no-such-path"}) == 1
    parse_switchyard(SERVICES[SIMS[0]]["command"])


def test_the_pytorch_worker_joins_and_serves_through_the_gateway(fleet: NativeFleet) -> None:
    """The compose file's `switchyard worker` (the bundled SmolLM2 on the CPU) joins through its
    heartbeat, and the demo key gets an answer from the real model through a gateway."""
    admin_token = environment(SERVICES["gateway"])["SWITCHYARD_ADMIN_TOKEN"]
    headers = {"Authorization": f"Bearer {admin_token}"}

    def joined() -> dict[str, Any]:
        response = httpx.get(f"{fleet.gateway_urls[0]}/admin/fleet", timeout=5, headers=headers)
        return {b["url"]: b for b in response.json()["data"] if b["url"] in fleet.worker_urls}

    assert wait_until(lambda: len(joined()) == len(fleet.worker_urls), timeout_s=15), joined()
    (worker,) = joined().values()
    assert worker["is_healthy"] and worker["source"] == "heartbeat"
    key = demo_key(fleet.init_outputs[0])
    response = httpx.post(f"{fleet.gateway_urls[-1]}/v1/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": worker["models"][0], "max_tokens": 4, "temperature": 0,
                                "messages": [{"role": "user", "content": "Say hi."}]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == worker["models"][0] and body["usage"]["completion_tokens"] >= 1
    assert body["choices"][0]["message"]["content"]
