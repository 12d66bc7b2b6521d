"""deploy/k8s: every overlay renders (`kubectl kustomize`), validates against the Kubernetes
schemas offline (kubernetes-validate, strict), and keeps its invariants: labels and selectors
agree, probes, resources, GPUs, PDB, HPA, NetworkPolicies, secrets, and every command and
configuration is one the real code accepts."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.cli import commands as gateway_cli
from gateway.server import FINAL_WRITE_S
from gateway.settings import ENV_PREFIX, load_settings
from tests.deploy.manifests import (
    K8S,
    OVERLAYS,
    containers,
    named,
    of_kind,
    option,
    parse_switchyard,
    pod_labels,
    render,
    render_overlay,
    selects,
    workloads,
)

# The oldest Kubernetes the manifests claim (PDB unhealthyPodEvictionPolicy) and the newest
# schema kubernetes-validate ships.
K8S_VERSIONS = ("1.27.0", "1.37.0")
SWITCHYARD_IMAGES = ("switchyard-gateway", "switchyard-worker")
RENDERED = {overlay: render_overlay(overlay) for overlay in OVERLAYS}


def _is_ours(container: dict[str, Any]) -> bool:
    return any(name in container["image"] for name in SWITCHYARD_IMAGES)


def _gateway(resources: list[dict[str, Any]]) -> dict[str, Any]:
    return named(resources, "Deployment", "switchyard-gateway")


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


@pytest.mark.parametrize("path", _kustomizations(), ids=lambda p: str(p.parent.relative_to(K8S)))
def test_every_file_a_kustomization_names_exists(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    names = [*spec.get("resources", []), *spec.get("components", [])]
    names += [patch["path"] for patch in spec.get("patches", []) if "path" in patch]
    for generator in (*spec.get("configMapGenerator", []), *spec.get("secretGenerator", [])):
        names += [item.split("=", 1)[-1] for item in generator.get("files", [])]
    for name in names:
        target = path.parent / name
        assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{path}: {name}"
    listed = {(path.parent / n).resolve() for n in names}
    for manifest in path.parent.glob("*.yaml"):
        if manifest.name not in ("kustomization.yaml", "secrets.example.yaml"):
            assert manifest.resolve() in listed, f"{manifest} is in no kustomization"


def test_every_manifest_parses() -> None:
    generated_from = {(path.parent / item.split("=", 1)[-1]).resolve()
                      for path in _kustomizations()
                      for generator in yaml.safe_load(path.read_text()).get(
                          "configMapGenerator", [])
                      for item in generator.get("files", [])}
    assert generated_from, "the gateway configuration comes from a configMapGenerator"
    for path in sorted(K8S.rglob("*.yaml")):
        if path.resolve() in generated_from:
            continue  # not a manifest: the gateway configuration (checked below)
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), path


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_resources_validate_against_the_schemas(overlay: str, version: str) -> None:
    for resource in RENDERED[overlay]:
        kubernetes_validate.validate(resource, version, strict=True)
    broken = copy.deepcopy(_gateway(RENDERED[overlay]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):  # the check is really strict
        kubernetes_validate.validate(broken, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_labels_and_selectors_agree(overlay: str) -> None:
    resources = RENDERED[overlay]
    pods = {w["metadata"]["name"]: pod_labels(w) for w in workloads(resources)}
    for workload in workloads(resources):
        name = workload["metadata"]["name"]
        assert selects(workload["spec"]["selector"], pods[name]), f"{name} selects no own pod"
        others = [n for n, labels in pods.items()
                  if n != name and selects(workload["spec"]["selector"], labels)]
        assert not others, f"Deployment {name}'s selector also takes {others}'s pods"
    for service in of_kind(resources, "Service"):
        chosen = [w for w in workloads(resources)
                  if selects(service["spec"]["selector"], pod_labels(w), is_plain_map=True)]
        assert len(chosen) == 1, f"Service {service['metadata']['name']} selects {len(chosen)}"
        port_names = {p.get("name") for c in containers(chosen[0]) for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    gateway = _gateway(resources)
    pdb = named(resources, "PodDisruptionBudget", "switchyard-gateway")
    assert selects(pdb["spec"]["selector"], pod_labels(gateway))
    hpa = named(resources, "HorizontalPodAutoscaler", "switchyard-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "switchyard-gateway"}
    for policy in of_kind(resources, "NetworkPolicy"):
        assert any(selects(policy["spec"]["podSelector"], labels) for labels in pods.values())


def test_servicemonitors_select_the_services(tmp_path: Path) -> None:
    """The optional component, added to the prod overlay as its comment says."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / "prod", tmp_path)],
        "components": [os.path.relpath(K8S / "components" / "servicemonitor", tmp_path)],
    }))
    resources = render(tmp_path)
    monitors = [r for r in resources if r["kind"] == "ServiceMonitor"]
    services = of_kind(resources, "Service")
    for monitor in monitors:
        chosen = [s for s in services if selects(monitor["spec"]["selector"],
                                                 s["metadata"]["labels"])]
        assert len(chosen) == 1
        port_names = {p["name"] for p in chosen[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    assert len(monitors) == 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_invariants(overlay: str, tmp_path: Path) -> None:
    resources = RENDERED[overlay]
    gateway = _gateway(resources)
    hpa = named(resources, "HorizontalPodAutoscaler", "switchyard-gateway")
    assert gateway["spec"]["replicas"] >= 2 and hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = named(resources, "PodDisruptionBudget", "switchyard-gateway")
    assert pdb["spec"]["maxUnavailable"] == 1
    [container] = containers(gateway)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    settings = _gateway_settings(resources, tmp_path)
    assert ports["http"] == settings.listen.port
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    pause_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace_s = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # The drain, then a second for the last error events (gateway.server.FINAL_WRITE_S).
    assert grace_s > pause_s + settings.drain_timeout_s + FINAL_WRITE_S + 2, \
        "killed before it drained"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_worker_invariants(overlay: str) -> None:
    worker = named(RENDERED[overlay], "Deployment", "switchyard-worker")
    spec = worker["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        spec["tolerations"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert option(container["args"], "--device") == "cuda"
    assert worker["spec"]["replicas"] == (0 if overlay == "dev" else 4)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies(overlay: str) -> None:
    resources = RENDERED[overlay]
    policies = of_kind(resources, "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1 and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert not deny[0]["spec"].get("ingress") and not deny[0]["spec"].get("egress")
    gateway_labels = pod_labels(_gateway(resources))
    for workload in workloads(resources):
        labels = pod_labels(workload)
        own = [p for p in policies if p["spec"]["podSelector"] and selects(
            p["spec"]["podSelector"], labels)]
        assert len(own) == 1, f"{workload['metadata']['name']}: {len(own)} policies"
        ingress_peers = [peer for rule in own[0]["spec"].get("ingress", [])
                         for peer in rule.get("from", [])]
        component = labels["app.kubernetes.io/component"]
        ports = [p["containerPort"] for c in containers(workload) for p in c.get("ports", [])]
        if component in ("worker", "redis"):  # only the gateway (and workers, for Redis)
            allowed = [peer for peer in ingress_peers if "podSelector" in peer]
            assert any(selects(peer["podSelector"], gateway_labels) for peer in allowed)
            for peer in allowed:
                chosen = [pod_labels(w)["app.kubernetes.io/component"] for w in workloads(
                    resources) if selects(peer["podSelector"], pod_labels(w))]
                assert set(chosen) <= ({"gateway"} if component == "worker" else
                                       {"gateway", "worker"}), chosen
            namespaces = [peer["namespaceSelector"] for peer in ingress_peers
                          if "namespaceSelector" in peer]
            assert namespaces in ([], [{"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}]), "only Prometheus besides"
            for rule in own[0]["spec"]["ingress"]:
                assert rule.get("from"), "every ingress rule names its sources"
            egress_ports = {p["port"] for r in own[0]["spec"].get("egress", [])
                            for p in r["ports"]}
            assert egress_ports <= {6379, 6380, 4317, 4318, 53}
        if component == "worker":  # the gateway's egress reaches every worker port
            rules = _policy_for(policies, gateway_labels)["spec"]["egress"]
            to_workers = [r for r in rules if any(selects(peer.get("podSelector"), labels)
                                                  for peer in r.get("to", []))]
            for port in ports:
                assert any(p["port"] <= port <= p.get("endPort", p["port"])
                           for r in to_workers for p in r["ports"])
        assert not ports or any(_allows(rule, port) for rule in own[0]["spec"]["ingress"]
                                for port in ports)
        if component in ("gateway", "worker"):  # quotas and fleet state; heartbeats
            assert any(_allows(rule, 6379) for rule in own[0]["spec"]["egress"])


def _policy_for(policies: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    [policy] = [p for p in policies if p["spec"]["podSelector"] and selects(
        p["spec"]["podSelector"], labels)]
    return policy


def _allows(rule: dict[str, Any], port: int) -> bool:
    return any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule.get("ports", []))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_locked_down(overlay: str) -> None:
    for workload in workloads(RENDERED[overlay]):
        spec = workload["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"], "every container requests resources"
            image = container["image"]
            assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scrape_annotations_name_a_metrics_port(overlay: str) -> None:
    for workload in workloads(RENDERED[overlay]):
        if not any(_is_ours(c) for c in containers(workload)):
            continue
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for c in containers(workload) for p in c["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports


def _gateway_settings(resources: list[dict[str, Any]], tmp: Path) -> Any:
    gateway = _gateway(resources)
    [container] = containers(gateway)
    config_path = option(container["args"], "--config")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume_name = mounts[str(Path(config_path).parent)]
    [volume] = [v for v in gateway["spec"]["template"]["spec"]["volumes"]
                if v["name"] == volume_name]
    config_map = named(resources, "ConfigMap", volume["configMap"]["name"])
    text = config_map["data"][Path(config_path).name]
    path = tmp / f"{config_map['metadata']['name']}.yaml"
    path.write_text(text)
    assert gateway_cli.main(["config", "check", str(path)]) == 0
    # Secrets are placeholders here; what matters is that each variable names a setting.
    env = {name: "redis://placeholder:6379/0" if name.endswith("REDIS_URL") else "x" * 32
           for name in _env(container) if name.startswith(ENV_PREFIX)}
    return load_settings(path, environ=env)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_config_map_and_environment_are_real_settings(overlay: str,
                                                              tmp_path: Path) -> None:
    settings = _gateway_settings(RENDERED[overlay], tmp_path)
    assert settings.listen.host == "0.0.0.0" and settings.routing.discover_workers
    assert settings.redis_url == "redis://placeholder:6379/0", "SWITCHYARD_REDIS_URL applies"
    assert settings.admin_token is not None and settings.key_secret is not None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_container_commands_match_the_cli(overlay: str) -> None:
    for workload in workloads(RENDERED[overlay]):
        for container in containers(workload):
            if not _is_ours(container):
                continue
            assert "command" not in container, "keep the image's entrypoint (switchyard)"
            env = _env(container)
            argv = []
            for arg in container["args"]:
                for variable in re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", arg):
                    assert variable in env, f"$({variable}) is not in the container's env"
                argv.append(re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)", lambda m: {
                    "POD_IP": "10.0.0.7"}.get(m.group(1), "redis://redis:6379/0"), arg))
            args = parse_switchyard(argv)
            if argv[0] in ("sim", "worker"):  # listen on, and advertise, the pod's address
                assert option(container["args"], "--host") == "$(POD_IP)"
                assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
                assert args.redis_url == "redis://redis:6379/0"
                port = int(option(argv, "--base-port" if argv[0] == "sim" else "--port"))
                assert port in {p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secret_references_resolve(overlay: str) -> None:
    resources = RENDERED[overlay]
    if overlay == "prod":  # made out of band; the example documents their shape
        assert not of_kind(resources, "Secret"), "prod must not ship secrets"
        example = K8S / "overlays" / "prod" / "secrets.example.yaml"
        secrets = list(yaml.safe_load_all(example.read_text()))
        available = {(s["metadata"]["name"], key) for s in secrets for key in s["stringData"]}
    else:
        secrets = of_kind(resources, "Secret")
        available = {(s["metadata"]["name"], key) for s in secrets for key in s["data"]}
        assert all("change-me" in item for item in (K8S / "overlays/dev/kustomization.yaml")
                   .read_text().split() if item.startswith(("admin-token=", "key-secret=")))
    for workload in workloads(resources):
        for container in containers(workload):
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert (ref["name"], ref["key"]) in available, ref
