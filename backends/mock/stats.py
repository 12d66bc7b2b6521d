"""Request counters of the mock engine, as /mock/stats JSON and vLLM-named metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["completed", "cancelled", "aborted"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length")


@dataclass(slots=True)
class MockStats:
    """Counters since start (or the last ``reset()``) plus what is in flight now.

    ``completed`` means a response was sent in full, errors included;
    ``cancelled`` the client went away first; ``aborted`` the engine cut the
    connection on purpose (``mock.die_after_chunks``).

    Example::

        stats = MockStats()
        stats.start()
        stats.finish("completed")
        assert stats.snapshot()["requests_completed"] == 1
    """

    requests_started: int = 0
    requests_completed: int = 0
    requests_cancelled: int = 0
    requests_aborted: int = 0
    in_flight: int = 0
    metrics_scrapes: int = 0  # GETs of /metrics answered
    num_running_by_model: dict[str, int] = field(default_factory=dict)
    num_waiting_by_model: dict[str, int] = field(default_factory=dict)
    num_success_by_model_reason: dict[tuple[str, str], int] = field(default_factory=dict)
    # Kept as received; turned into plain JSON only when /mock/stats is read.
    last_headers: Mapping[str, str] | None = None
    last_body: Any = None

    def start(self) -> None:
        self.requests_started += 1
        self.in_flight += 1

    def finish(self, outcome: Outcome) -> None:
        self.in_flight -= 1
        if outcome == "completed":
            self.requests_completed += 1
        elif outcome == "cancelled":
            self.requests_cancelled += 1
        else:
            self.requests_aborted += 1

    def record_success(self, model: str, finish_reason: str) -> None:
        key = (model, finish_reason)
        self.num_success_by_model_reason[key] = self.num_success_by_model_reason.get(key, 0) + 1

    def reset(self) -> None:
        """Zero the counters; the in-flight gauges keep tracking live requests."""
        self.requests_started = self.requests_completed = 0
        self.requests_cancelled = self.requests_aborted = 0
        self.metrics_scrapes = 0
        self.num_success_by_model_reason.clear()
        self.last_headers = None
        self.last_body = None

    def snapshot(self) -> dict[str, Any]:
        headers = self.last_headers or {}
        return {
            "requests_started": self.requests_started,
            "requests_completed": self.requests_completed,
            "requests_cancelled": self.requests_cancelled,
            "requests_aborted": self.requests_aborted,
            "in_flight": self.in_flight,
            "metrics_scrapes": self.metrics_scrapes,
            "last_headers": {name.lower(): value for name, value in headers.items()},
            "last_body": self.last_body,
        }


def render_metrics(stats: MockStats, models: tuple[str, ...]) -> str:
    """Prometheus text exposition with vLLM's metric names, one series per served model."""
    labels = {model: _escape_label(model) for model in models}
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
    ]
    lines += [
        f'vllm:num_requests_running{{model_name="{labels[model]}"}} '
        f"{stats.num_running_by_model.get(model, 0)}"
        for model in models
    ]
    lines += [
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
    ]
    lines += [
        f'vllm:num_requests_waiting{{model_name="{labels[model]}"}} '
        f"{stats.num_waiting_by_model.get(model, 0)}"
        for model in models
    ]
    lines += [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    lines += [
        f'vllm:request_success_total{{finished_reason="{reason}",model_name="{labels[model]}"}} '
        f"{stats.num_success_by_model_reason.get((model, reason), 0)}"
        for model in models
        for reason in FINISH_REASONS
    ]
    return "\n".join(lines) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
