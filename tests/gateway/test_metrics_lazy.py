"""The per-request figures kept as plain numbers scrape exactly as prometheus_client's own
counters and histogram would have recorded them."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observe.metrics import _LATENCY_BUCKETS_S, GatewayMetrics
from gateway.routes import ROUTE_PATHS

Key = tuple[str, tuple[tuple[str, str], ...]]  # a sample's name and its labels, sorted


def samples(registry: CollectorRegistry, prefix: str) -> dict[Key, float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith(prefix) and not s.name.endswith("_created")}


def test_requests_and_durations_scrape_as_prometheus_client_records_them() -> None:
    rng = random.Random(7)
    metrics = GatewayMetrics(["w0"])
    reference = CollectorRegistry()
    requests = Counter("switchyard_requests", "x", ["route", "model", "status"],
                       registry=reference)
    durations = Histogram("switchyard_request_duration_seconds", "x", ["route"],
                          buckets=_LATENCY_BUCKETS_S, registry=reference)
    for route in ROUTE_PATHS:
        durations.labels(route)
    for _ in range(2_000):
        route = rng.choice(list(ROUTE_PATHS))
        model = rng.choice(["m", None])
        status = rng.choice([200, 200, 429, 503])
        # values on the bucket bounds too: a bound belongs to its own bucket (le)
        duration_s = rng.choice([rng.uniform(0, 400), rng.choice(_LATENCY_BUCKETS_S)])
        metrics.observe_request(route, model, status, duration_s)
        requests.labels(route, model or "other", str(status)).inc()
        durations.labels(route).observe(duration_s)
    for prefix in ("switchyard_requests_total", "switchyard_request_duration_seconds"):
        ours, theirs = samples(metrics.registry, prefix), samples(reference, prefix)
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert abs(ours[key] - value) <= 1e-9 * max(1.0, value), key


def test_charges_and_routing_tokens_add_up() -> None:
    metrics = GatewayMetrics([])
    assert samples(metrics.registry, "switchyard_routing_prompt_tokens_total") == {
        ("switchyard_routing_prompt_tokens_total", ()): 0.0}  # there before any request
    metrics.observe_routing(100, 40)
    metrics.observe_routing(50, 0)
    metrics.observe_charge("acme", "m", "USD", 10, 4, 7, 2_500_000_000)
    metrics.observe_charge("acme", "m", "USD", 5, 0, 3, 0)
    found = samples(metrics.registry, "switchyard_")
    assert found[("switchyard_routing_prompt_tokens_total", ())] == 150
    assert found[("switchyard_routing_expected_cached_tokens_total", ())] == 40
    labels = (("model", "m"), ("tenant", "acme"))
    for kind, value in (("prompt", 15), ("cached", 4), ("output", 10)):
        assert found[("switchyard_tenant_tokens_total", (("kind", kind), *labels))] == value
    assert found[("switchyard_tenant_cost_total", (("currency", "USD"), *labels))] == 2.5
