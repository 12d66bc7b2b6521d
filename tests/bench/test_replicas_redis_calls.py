"""bench.replicas counts the Redis commands a run cost, from a real Redis's commandstats."""

from __future__ import annotations

import redis

from bench.replicas.bench import calls_between, redis_calls


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
