"""Prometheus histograms of waits and of TTFT / TPOT / end-to-end latency, by tier.

Observed once per request on the event loop, so they are plain bucket counts (about a quarter
of a ``prometheus_client.Histogram.observe``, which takes a lock per call), turned into metric
families when ``/metrics`` is scraped. Labels are bounded: wait types from
``gateway.observe.waits`` and the configured tiers (anything else is ``"other"``).

Example::

    metrics = WaitMetrics(gateway_metrics, ["interactive", "standard", "batch"])
    metrics.observe("batch", {"admission_queue": 0.8}, e2e_s=1.1, ttft_s=0.9, tpot_s=0.02)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import HistogramMetricFamily

from gateway.observe.metrics import GatewayMetrics
from gateway.observe.waits import WAIT_TYPES

WAIT_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                  0.5, 1.0, 2.5)


class _Buckets:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


class WaitMetrics:
    """Per (wait, tier) and per tier histograms, exported through the gateway's registry."""

    def __init__(self, metrics: GatewayMetrics, tier_names: Iterable[str]) -> None:
        self.tiers = (*tier_names, "other")
        self._waits = {(w, t): _Buckets(WAIT_BUCKETS_S) for w in WAIT_TYPES for t in self.tiers}
        self._ttft = {t: _Buckets(WAIT_BUCKETS_S) for t in self.tiers}
        self._tpot = {t: _Buckets(TPOT_BUCKETS_S) for t in self.tiers}
        self._e2e = {t: _Buckets(WAIT_BUCKETS_S) for t in self.tiers}
        metrics.add_source(self.collect)

    def observe(self, tier: str, waits: Mapping[str, float], e2e_s: float,
                ttft_s: float | None, tpot_s: float | None) -> None:
        if tier not in self._e2e:
            tier = "other"
        for wait, seconds in waits.items():
            self._waits[wait, tier].observe(seconds)
        self._e2e[tier].observe(e2e_s)
        if ttft_s is not None:
            self._ttft[tier].observe(ttft_s)
        if tpot_s is not None:
            self._tpot[tier].observe(tpot_s)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        waits = HistogramMetricFamily(
            "switchyard_wait_duration_seconds",
            "Time requests spent in each wait (auth, quota, admission_queue, routing, "
            "upstream_connect, upstream_ttft, upstream_response, streaming), by tier.",
            labels=["wait", "tier"])
        for (wait, tier), buckets in self._waits.items():
            waits.add_metric([wait, tier], buckets.cumulative(), buckets.total)
        yield waits
        for name, doc, table in (
            ("switchyard_ttft_seconds", "Time to first token at the gateway (streams), by tier.",
             self._ttft),
            ("switchyard_tpot_seconds",
             "Time per output token after the first (streams), by tier.", self._tpot),
            ("switchyard_e2e_duration_seconds",
             "End-to-end duration of completion requests at the gateway, by tier.", self._e2e),
        ):
            family = HistogramMetricFamily(name, doc, labels=["tier"])
            for tier, buckets in table.items():
                family.add_metric([tier], buckets.cumulative(), buckets.total)
            yield family
