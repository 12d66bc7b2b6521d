"""bench.replicas counts the Redis commands a run cost, from a real Redis's commandstats, and
the pages the engines served."""

from __future__ import annotations

from pathlib import Path

import httpx
import redis

from bench.replicas.bench import calls_between, engine_pages, redis_calls
from gateway.cli.localfleet import LocalFleet


def test_the_calls_between_two_reads_are_the_commands_sent_between(
        private_redis_url: str) -> None:
    client = redis.Redis.from_url(private_redis_url)
    try:
        before = redis_calls(private_redis_url)
        for i in range(3):
            client.xadd("bench-calls", {"n": i})
        client.xread({"bench-calls": "0"}, count=10)
        calls = calls_between(before, redis_calls(private_redis_url))
    finally:
        client.delete("bench-calls")
        client.close()
    assert calls["xadd"] == 3 and calls["xread"] == 1
    assert "info" not in calls  # the reads themselves are left out
    assert redis_calls(None) == {} and calls_between({"get": 2}, {"get": 2}) == {}


def test_engine_pages_counts_the_scrapes_and_probes_the_engines_served(tmp_path: Path) -> None:
    """``engine_pages``: the /metrics and /health GETs a real ``backends.sim`` process's workers
    served, all of them together."""
    with LocalFleet(tmp_path, grace_s=5) as fleet:
        urls = fleet.start_sims(2, model="switchyard-sim", has_redis=False,
                                health_timeout_s=30)
        before = engine_pages(urls)
        for _ in range(3):
            httpx.get(urls[0] + "/metrics").raise_for_status()
        httpx.get(urls[1] + "/metrics").raise_for_status()
        httpx.get(urls[1] + "/health").raise_for_status()
        after = engine_pages(urls)
    assert after["/metrics"] - before["/metrics"] == 4
    assert after["/health"] - before["/health"] == 1
