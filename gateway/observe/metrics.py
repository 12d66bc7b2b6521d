"""Prometheus metrics, one registry per app (so several apps can live in one test process).

Label values come from bounded sets only: routes, configured model and backend names, status
codes. A model name the configuration does not know is recorded as ``"other"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


class GatewayMetrics:
    def __init__(self, backend_names: list[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "switchyard_requests",
            "Completion requests by route, model and HTTP status.",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.tenant_tokens = Counter(
            "switchyard_tenant_tokens",
            "Tokens charged to tenants (usage accounting) by model and kind: prompt (cached "
            "ones included), cached, output.",
            ["tenant", "model", "kind"],
            registry=self.registry,
        )
        self.tenant_cost = Counter(
            "switchyard_tenant_cost",
            "Cost charged to tenants at the configured prices (usage.prices), in currency units.",
            ["tenant", "model", "currency"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "switchyard_request_duration_seconds",
            "End-to-end request duration at the gateway.",
            ["route"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.streamed_chunks = Counter(
            "switchyard_streamed_chunks",
            "Chunks of streamed responses relayed to clients.",
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "switchyard_upstream_errors",
            "Failed upstream attempts by backend and reason.",
            ["backend", "reason"],
            registry=self.registry,
        )
        self.retries = Counter(
            "switchyard_upstream_retries",
            "Requests retried on another backend before any byte reached the client.",
            registry=self.registry,
        )
        self.client_disconnects = Counter(
            "switchyard_client_disconnects",
            "Requests whose client went away before the response finished.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "switchyard_in_flight_requests",
            "Completion requests being served.",
            registry=self.registry,
        )
        self.backend_healthy = Gauge(
            "switchyard_backend_healthy",
            "1 when the backend passes health checks.",
            ["backend"],
            registry=self.registry,
        )
        self.ejections = Counter(
            "switchyard_backend_ejections",
            "Backends ejected by their circuit breaker (failures in a row, error rate, latency).",
            ["backend"],
            registry=self.registry,
        )
        self.breaker_state = Gauge(
            "switchyard_backend_breaker_state",
            "The backend's circuit breaker: 0 closed, 1 open (ejected), 2 half-open (probing).",
            ["backend"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "switchyard_auth_failures",
            "Requests rejected by authentication, by error code.",
            ["code"],
            registry=self.registry,
        )
        self.routing_prompt_tokens = Counter(
            "switchyard_routing_prompt_tokens",
            "Prompt tokens of routed requests (the denominator of the expected prefix-hit ratio).",
            registry=self.registry,
        )
        self.routing_expected_cached_tokens = Counter(
            "switchyard_routing_expected_cached_tokens",
            "Prompt tokens the chosen backend was expected to hold in its prefix cache.",
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], Counter] = {}
        self._charge_children: dict[tuple[str, str],
                                    tuple[Counter, Counter, Counter, Counter]] = {}
        self._duration_children = {
            route: self.request_duration.labels(route) for route in ("chat", "completions")
        }
        for name in backend_names:
            self.backend_healthy.labels(name).set(1)

    def add_source(self, collect: Callable[[], Iterator[object]]) -> None:
        """Register figures other components keep (read at scrape time, nothing per request)."""
        self.registry.register(_CallbackCollector(collect))

    def observe_routing(self, num_prompt_tokens: int, num_expected_cached_tokens: int) -> None:
        self.routing_prompt_tokens.inc(num_prompt_tokens)
        self.routing_expected_cached_tokens.inc(num_expected_cached_tokens)

    def observe_request(self, route: str, model: str | None, status: int,
                        duration_s: float) -> None:
        """One finished request; ``model``: a model the fleet serves (a bounded set), or None
        (unknown, or not read: labelled ``other``)."""
        label = model or "other"
        key = (route, label, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(route, label, str(status))
            self._request_children[key] = child
        child.inc()
        self._duration_children[route].observe(duration_s)


    def observe_charge(self, tenant: str, model: str, currency: str, prompt_tokens: int,
                       cached_tokens: int, output_tokens: int, cost_nano: int) -> None:
        children = self._charge_children.get((tenant, model))
        if children is None:
            children = self._charge_children[(tenant, model)] = (
                self.tenant_tokens.labels(tenant, model, "prompt"),
                self.tenant_tokens.labels(tenant, model, "cached"),
                self.tenant_tokens.labels(tenant, model, "output"),
                self.tenant_cost.labels(tenant, model, currency))
        prompt, cached, output, cost = children
        prompt.inc(prompt_tokens)
        cached.inc(cached_tokens)
        output.inc(output_tokens)
        if cost_nano:
            cost.inc(cost_nano / 1e9)


class _CallbackCollector(Collector):
    def __init__(self, collect: Callable[[], Iterator[object]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[object]:  # type: ignore[override]
        return self._collect()


def counter_family(name: str, doc: str, label: str | None,
                   values: Mapping[str, float] | float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label] if label else None)
    if isinstance(values, Mapping):
        for key, value in values.items():
            family.add_metric([key], value)
    else:
        family.add_metric([], values)
    return family


def gauge_family(name: str, doc: str, label: str | None,
                 values: Mapping[str, float] | float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label] if label else None)
    if isinstance(values, Mapping):
        for key, value in values.items():
            family.add_metric([key], value)
    else:
        family.add_metric([], values)
    return family
