"""The worker's ``/metrics`` page, with vLLM's metric names.

The gauges and counters are the simulated worker's (``backends/sim/server.py``), line for line,
so the gateway's scraper, ``bench`` and the dashboards read both workers the same way. On top,
the request latency histograms vLLM exports, with vLLM's buckets: time to first token, time per
output token, end-to-end latency and time queued, observed when a request finishes (not when
it is aborted).

Example::

    metrics = WorkerMetrics("SmolLM2-135M-Instruct")
    metrics.observe(handle.phases())            # once the request has finished
    page = metrics.render(engine)               # text/plain; version=0.0.4
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING

from backends.engine_core.types import EnginePhases

if TYPE_CHECKING:
    from backends.worker.async_engine import AsyncEngine

CONTENT_TYPE = "text/plain; version=0.0.4"
# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """A Prometheus histogram without a registry: cumulative buckets, sum and count.

    Example::

        histogram = Histogram("vllm:e2e_request_latency_seconds", (0.5, 1.0))
        histogram.observe(0.7)
        histogram.lines('model_name="m"')   # TYPE line, 3 buckets, _sum and _count
    """

    def __init__(self, name: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value`` (a request's mean time per output
        token stands for each of its intervals)."""
        self.counts[bisect_left(self.buckets, value)] += count
        self.sum += value * count
        self.count += count

    def lines(self, labels: str) -> list[str]:
        lines = [f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip((*self.buckets, "+Inf"), self.counts, strict=True):
            cumulative += count
            lines.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.sum}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


class WorkerMetrics:
    """The request histograms of one worker and the rendering of its whole page."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.ttft = Histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS_S)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", TPOT_BUCKETS_S)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", REQUEST_BUCKETS_S)
        self.queue = Histogram("vllm:request_queue_time_seconds", REQUEST_BUCKETS_S)

    def observe(self, phases: EnginePhases) -> None:
        """A finished request's timings; a request without its first token or its end (it
        was aborted) is not observed."""
        if phases.first_token_s is None or phases.finish_s is None:
            return
        self.ttft.observe(phases.first_token_s - phases.arrival_s)
        self.e2e.observe(phases.finish_s - phases.arrival_s)
        if phases.scheduled_s is not None:
            self.queue.observe(phases.scheduled_s - phases.arrival_s)
        if phases.num_decode_steps > 0:
            self.tpot.observe((phases.finish_s - phases.first_token_s) / phases.num_decode_steps,
                              phases.num_decode_steps)

    def render(self, engine: AsyncEngine) -> bytes:
        core = engine.core_load()
        load = engine.load()  # counts the requests not yet handed to the engine thread
        label = f'model_name="{self.model}"'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {load['num_running']}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} {load['num_waiting']}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{label}}} {core.kv_usage}",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{{{label}}} {core.prefix_cache_queries_tokens}",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{{{label}}} {core.prefix_cache_hits_tokens}",
            "# TYPE vllm:num_preemptions counter",
            f"vllm:num_preemptions_total{{{label}}} {core.num_preemptions}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{{{label}}} {engine.num_prompt_tokens_total}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{{{label}}} {engine.num_generation_tokens_total}",
            "# TYPE vllm:request_success counter",
        ]
        for reason in ("stop", "length"):  # as the simulator: aborted requests did not succeed
            count = engine.num_requests_finished.get(reason, 0)
            lines.append(f'vllm:request_success_total{{{label},finished_reason="{reason}"}} '
                         f"{count}")
        for histogram in (self.ttft, self.tpot, self.e2e, self.queue):
            lines += histogram.lines(label)
        return ("\n".join(lines) + "\n").encode()
