"""Load spread across workers, from their Prometheus ``/metrics`` before and after a run.

Each worker's delta of ``vllm:request_success_total`` (all finish reasons) and
``vllm:prompt_tokens_total``; spread is max / mean of the deltas (1.0: perfectly even).
Example::

    before = scrape_all(urls)
    ...  # the run
    spread = load_spread(before, scrape_all(urls))   # {"per_worker": ..., "max_mean_requests": ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from backends.fleet.prom import metric_sums

COUNTERS = {"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total"}


def parse_counters(text: str) -> dict[str, float]:
    """Sums of the `COUNTERS` over all their label sets, from a Prometheus text page."""
    return dict.fromkeys(COUNTERS, 0.0) | metric_sums(
        text, {name: (metric,) for name, metric in COUNTERS.items()})


def scrape_all(urls: Sequence[str]) -> dict[str, dict[str, float]]:
    """Counters of each worker; a worker that cannot be read is left out."""
    counters: dict[str, dict[str, float]] = {}
    with httpx.Client(timeout=5) as client:
        for url in urls:
            try:
                response = client.get(url)
                response.raise_for_status()
            except httpx.HTTPError:
                continue
            counters[url] = parse_counters(response.text)
    return counters


def max_over_mean(values: Sequence[float]) -> float | None:
    """Imbalance of ``values``: 1.0 when even; None when all are zero."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def load_spread(before: Mapping[str, Mapping[str, float]],
                after: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Per-worker deltas between two scrapes, and their max / mean."""
    per_worker = {url: {name: after[url][name] - before[url][name] for name in COUNTERS}
                  for url in after if url in before}
    return {
        "per_worker": per_worker,
        "max_mean_requests": max_over_mean([d["requests"] for d in per_worker.values()]),
        "max_mean_prompt_tokens": max_over_mean([d["prompt_tokens"]
                                                 for d in per_worker.values()]),
    }
