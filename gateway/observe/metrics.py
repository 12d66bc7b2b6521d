"""Prometheus metrics, one registry per app (so several apps can live in one test process).

Label values come from bounded sets only: routes, configured model and backend names, status
codes. A model name the configuration does not know is recorded as ``"other"``.

The figures every request moves (requests by status, their duration, tenants' tokens and
cost, routing's token counts) are plain numbers here, added to without a lock, and turned
into metric families only when ``/metrics`` is scraped: ``prometheus_client``'s counters take a
lock and check their amount on every ``inc`` (~1 µs each, ten per request).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.routes import ROUTE_PATHS

_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


class _Durations:
    """A histogram's buckets, sum and count as plain numbers (``le`` buckets, as Prometheus)."""

    __slots__ = ("counts", "total_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS_S) + 1)  # the last: above every bound
        self.total_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(_LATENCY_BUCKETS_S, value_s)] += 1
        self.total_s += value_s

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for bound, count in zip((*_LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        return out


class GatewayMetrics:
    def __init__(self, backend_names: list[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Per request: plain numbers, read at scrape time (_per_request_families).
        self._request_counts: dict[tuple[str, str, int], int] = {}
        self._durations = {route: _Durations() for route in ROUTE_PATHS}
        # (tenant, model, currency) -> [prompt, cached, output tokens, cost]
        self._charges: dict[tuple[str, str, str], list[float]] = {}
        self._routing_tokens = [0, 0]  # prompt tokens routed, of them expected cached
        self.registry.register(_CallbackCollector(self._per_request_families))
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
        self.fallbacks = Counter(
            "switchyard_model_fallbacks",
            "Requests for a model alias passed on to its next model (the picked one had no "
            "healthy or admissible backend, or failed before any byte reached the client).",
            ["model", "fallback"],
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
        for name in backend_names:
            self.backend_healthy.labels(name).set(1)

    def add_source(self, collect: Callable[[], Iterator[object]]) -> None:
        """Register figures other components keep (read at scrape time, nothing per request)."""
        self.registry.register(_CallbackCollector(collect))

    def observe_routing(self, num_prompt_tokens: int, num_expected_cached_tokens: int) -> None:
        tokens = self._routing_tokens
        tokens[0] += max(0, num_prompt_tokens)
        tokens[1] += max(0, num_expected_cached_tokens)

    def observe_request(self, route: str, model: str | None, status: int,
                        duration_s: float) -> None:
        """One finished request; ``model``: a model the fleet serves (a bounded set), or None
        (unknown, or not read: labelled ``other``)."""
        key = (route, model or "other", status)
        counts = self._request_counts
        counts[key] = counts.get(key, 0) + 1
        self._durations[route].observe(max(0.0, duration_s))

    def observe_charge(self, tenant: str, model: str, currency: str, prompt_tokens: int,
                       cached_tokens: int, output_tokens: int, cost_nano: int) -> None:
        key = (tenant, model, currency)
        charged = self._charges.get(key)
        if charged is None:
            charged = self._charges[key] = [0, 0, 0, 0.0]
        charged[0] += max(0, prompt_tokens)
        charged[1] += max(0, cached_tokens)
        charged[2] += max(0, output_tokens)
        if cost_nano > 0:
            charged[3] += cost_nano / 1e9

    def _per_request_families(self) -> Iterator[object]:
        requests = CounterMetricFamily(
            "switchyard_requests", "Completion requests by route, model and HTTP status.",
            labels=["route", "model", "status"])
        for (route, model, status), count in list(self._request_counts.items()):
            requests.add_metric([route, model, str(status)], count)
        yield requests
        durations = HistogramMetricFamily(
            "switchyard_request_duration_seconds", "End-to-end request duration at the gateway.",
            labels=["route"])
        for route, figures in self._durations.items():
            durations.add_metric([route], figures.buckets(), figures.total_s)
        yield durations
        tokens = CounterMetricFamily(
            "switchyard_tenant_tokens",
            "Tokens charged to tenants (usage accounting) by model and kind: prompt (cached "
            "ones included), cached, output.", labels=["tenant", "model", "kind"])
        cost = CounterMetricFamily(
            "switchyard_tenant_cost",
            "Cost charged to tenants at the configured prices (usage.prices), in currency units.",
            labels=["tenant", "model", "currency"])
        for (tenant, model, currency), charged in list(self._charges.items()):
            for kind, value in zip(("prompt", "cached", "output"), charged, strict=False):
                tokens.add_metric([tenant, model, kind], value)
            cost.add_metric([tenant, model, currency], charged[3])
        yield tokens
        yield cost
        prompt, cached = self._routing_tokens
        yield counter_family(
            "switchyard_routing_prompt_tokens",
            "Prompt tokens of routed requests (the denominator of the expected prefix-hit ratio).",
            None, prompt)
        yield counter_family(
            "switchyard_routing_expected_cached_tokens",
            "Prompt tokens the chosen backend was expected to hold in its prefix cache.",
            None, cached)


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
