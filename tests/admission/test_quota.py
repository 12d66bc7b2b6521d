"""The quota store on a real redis-server: exact limits, leases, replicas, headers, outages."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from admission.quota.lua import OPS_SCRIPT
from admission.quota.store import FailMode, QuotaLimits, QuotaStore, quota_keys
from gateway.cli.localproc import ProcessGroup, free_port, start_redis
from tests.admission.held import held_async, rid

ROOT = Path(__file__).resolve().parents[2]
HEADER_NAMES = {
    f"x-ratelimit-{kind}-{what}"
    for kind in ("limit", "remaining", "reset") for what in ("requests", "tokens")
}
DURATION_RE = r"^(0s|\d+ms|(\d+h)?(\d+m)?\d+(\.\d{1,3})?s)$"


async def test_request_burst_is_exact_then_paced(redis: aioredis.Redis, tenant: str) -> None:
    store, limits = QuotaStore(redis), QuotaLimits(requests_per_minute=60)
    decisions = [await store.acquire(tenant, limits, tokens=0, request_id=rid())
                 for _ in range(61)]
    assert [d.is_allowed for d in decisions] == [True] * 60 + [False]
    assert [d.remaining_requests for d in decisions[:60]] == list(range(59, -1, -1))
    refused = decisions[-1]
    assert refused.refused_by == "requests" and refused.http_status == 429
    assert refused.retry_after_ms is not None
    assert 900 <= refused.retry_after_ms <= 1100  # 60 s / 60, less the burst's own duration
    assert refused.headers()["retry-after"] == "1"


async def test_tokens_reserve_then_settle_refunds(redis: aioredis.Redis, tenant: str) -> None:
    store, limits = QuotaStore(redis), QuotaLimits(tokens_per_minute=1000)
    first, second = rid(), rid()
    assert (await store.acquire(tenant, limits, tokens=400, request_id=first)).is_allowed
    assert (await store.acquire(tenant, limits, tokens=400, request_id=second)).is_allowed
    refused = await store.acquire(tenant, limits, tokens=400, request_id=rid())
    assert refused.refused_by == "tokens" and refused.remaining_tokens == 200
    assert refused.retry_after_ms is not None
    assert 10_800 <= refused.retry_after_ms <= 13_200  # 200 tokens short at 1000/min = 12 s
    await store.settle(tenant, limits, reserved_tokens=400, actual_tokens=100, request_id=first)
    again = await store.acquire(tenant, limits, tokens=400, request_id=rid())
    assert again.is_allowed and again.remaining_tokens == 100
    await store.settle(tenant, limits, reserved_tokens=400, actual_tokens=600, request_id=second)
    over = await store.acquire(tenant, limits, tokens=1, request_id=rid())
    assert over.refused_by == "tokens" and over.remaining_tokens == 0  # the overrun is charged
    too_large = await store.acquire(tenant, limits, tokens=1001, request_id=rid())
    assert too_large.refused_by == "too_large" and too_large.retry_after_ms is None


async def test_refusal_charges_nothing(redis: aioredis.Redis, tenant: str) -> None:
    store = QuotaStore(redis)
    limits = QuotaLimits(requests_per_minute=100, tokens_per_minute=100, max_concurrent=1)
    assert (await store.acquire(tenant, limits, tokens=100, request_id=rid())).is_allowed
    refused = await store.acquire(tenant, limits, tokens=100, request_id=rid())
    assert refused.refused_by == "tokens"  # the longest wait names the refusal
    assert refused.remaining_requests == 99 and refused.num_leases == 1


async def test_concurrency_leases_settle_and_expire(redis: aioredis.Redis, tenant: str) -> None:
    store, limits = QuotaStore(redis, lease_ttl_s=0.5), QuotaLimits(max_concurrent=2)
    holders = [rid(), rid()]
    for holder in holders:
        assert (await store.acquire(tenant, limits, tokens=0, request_id=holder)).is_allowed
    third = await store.acquire(tenant, limits, tokens=0, request_id=rid())
    assert third.refused_by == "concurrency" and third.num_leases == 2
    assert third.retry_after_ms is not None and 0 < third.retry_after_ms <= 500
    assert await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                              request_id=holders[0])
    assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).is_allowed
    # Nobody settles now, as after a gateway crash: the TTL returns both slots.
    await asyncio.sleep(0.55)
    for _ in range(2):
        assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).is_allowed
    assert await held_async(redis, tenant) == 2
    assert 0 < await redis.pttl(quota_keys(tenant)[2]) <= 502


async def test_renew_keeps_a_long_stream_lease(redis: aioredis.Redis, tenant: str) -> None:
    store, limits = QuotaStore(redis, lease_ttl_s=0.3), QuotaLimits(max_concurrent=1)
    stream = rid()
    assert (await store.acquire(tenant, limits, tokens=0, request_id=stream)).is_allowed
    for _ in range(6):  # 0.6 s, twice the TTL, renewing every TTL / 3
        await asyncio.sleep(0.1)
        assert await store.renew(tenant, stream)
        other = await store.acquire(tenant, limits, tokens=0, request_id=rid())
        assert other.refused_by == "concurrency"
    await asyncio.sleep(0.35)
    assert not await store.renew(tenant, stream)  # expired: renew does not resurrect it
    assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).is_allowed


def race(redis_url: str, tenant: str, *args: str, rounds: int = 1) -> list[dict[str, Any]]:
    """Three ``tests.admission.quota_replica`` processes started together on "go"; with
    ``rounds`` 2, the second "go" once every replica says its settles were answered. Their
    reports."""
    go_key = f"sy:test:go:{tenant}"
    argv = [sys.executable, "-m", "tests.admission.quota_replica", redis_url, tenant, *args[:2],
            go_key, *args[2:]]
    replicas = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE) for _ in range(3)]
    client = sync_redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 15
        waits = [(":ready", go_key), (":settled", go_key + ":2")][:rounds]
        for counter, go in waits:
            while int(client.get(go_key + counter) or 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            client.rpush(go, 1, 2, 3)
        return [orjson.loads(replica.communicate(timeout=20)[0]) for replica in replicas]
    finally:
        for replica in replicas:
            replica.kill()
        client.close()


def test_exact_across_replicas(redis_url: str, tenant: str) -> None:
    """Three processes race one tenant at rpm=120: exactly 120 get in."""
    results = race(redis_url, tenant, "120", "80")
    # The GCRA refills one request per 0.5 s: the race must end before the first refill.
    span_us = max(r["ended_us"] for r in results) - min(r["started_us"] for r in results)
    assert span_us < 500_000, f"replicas took {span_us} us, too slow to test exactness"
    assert sum(r.get("admitted", 0) for r in results) == 120
    assert sum(r.get("requests", 0) for r in results) == 3 * 80 - 120
    assert all(r["counters"]["num_redis_errors"] == 0 for r in results)


def test_concurrency_exact_across_replicas(redis_url: str, tenant: str) -> None:
    """Three processes each make 30 acquires at once against max_concurrent=20 and hold
    them: exactly 20 get in, in all. All settled, the same burst again gets 20 in."""
    results = race(redis_url, tenant, "20", "30", "concurrency", rounds=2)
    assert sum(r["admitted"][0] for r in results) == 20
    assert sum(r["admitted"][1] for r in results) == 20
    assert all(r["counters"]["num_redis_errors"] == 0 for r in results)


async def test_headers_match_openai(redis: aioredis.Redis, tenant: str) -> None:
    store = QuotaStore(redis)
    limits = QuotaLimits(requests_per_minute=10, tokens_per_minute=6000)
    for _ in range(3):
        decision = await store.acquire(tenant, limits, tokens=1000, request_id=rid())
    headers = decision.headers()
    assert set(headers) == HEADER_NAMES
    assert headers["x-ratelimit-limit-requests"] == "10"
    assert headers["x-ratelimit-remaining-requests"] == "7"
    assert headers["x-ratelimit-limit-tokens"] == "6000"
    assert headers["x-ratelimit-remaining-tokens"] == "3000"
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        assert re.match(DURATION_RE, headers[name]), headers[name]
    assert 17_000 < (decision.reset_requests_ms or 0) <= 18_000  # 3 requests of 6 s each
    assert 29_000 < (decision.reset_tokens_ms or 0) <= 30_000  # 3000 tokens at 100 per s
    refused = await store.acquire(tenant, limits, tokens=4000, request_id=rid())
    assert set(refused.headers()) == HEADER_NAMES | {"retry-after", "retry-after-ms"}
    assert refused.headers()["retry-after-ms"] == str(refused.retry_after_ms)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: the worst Redis outage."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("is_silent", [pytest.param(False, id="refused-port"),
                                       pytest.param(True, id="silent-server")])
@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_outage_never_hangs(fail_mode: FailMode, is_silent: bool, silent_port: int,
                                  tenant: str) -> None:
    port = silent_port if is_silent else free_port()
    client = aioredis.Redis(host="127.0.0.1", port=port)
    store = QuotaStore(client, fail_mode=fail_mode, timeout_s=0.2)
    limits = QuotaLimits(requests_per_minute=3, max_concurrent=5)
    started = time.perf_counter()
    first = await store.acquire(tenant, limits, tokens=10, request_id=rid())
    assert time.perf_counter() - started < 0.2 + 0.15
    rest = [await store.acquire(tenant, limits, tokens=10, request_id=rid()) for _ in range(3)]
    assert time.perf_counter() - started < 0.2 + 0.2  # later calls skip Redis while it is down
    decisions = [first, *rest]
    assert store.is_redis_down and store.counters()["num_outages"] == 1
    if fail_mode == "open":
        assert [d.is_allowed for d in decisions] == [True, True, True, False]
        assert all(d.is_local for d in decisions) and decisions[-1].refused_by == "requests"
        assert store.counters()["num_fail_open"] == 4
    else:
        assert {(d.http_status, d.refused_by) for d in decisions} == {(503, "unavailable")}
        assert "unavailable" in first.message() and store.counters()["num_fail_closed"] == 4
        # Retry when Redis is tried again (outage_retry_s, 1 s by default).
        assert first.headers()["retry-after"] == "1" and "try again in 1s" in first.message()
    await client.aclose()


async def test_fail_open_then_recover(procs: ProcessGroup, workdir: Path, tenant: str) -> None:
    port = free_port()
    client = aioredis.Redis.from_url(start_redis(procs, workdir, port))
    store = QuotaStore(client, timeout_s=0.2, outage_retry_s=0.0)
    limits = QuotaLimits(requests_per_minute=100, max_concurrent=1)
    first = rid()
    assert not (await store.acquire(tenant, limits, tokens=0, request_id=first)).is_local
    name, child = next(c for c in procs.children if c[0] == f"redis-{port}")
    child.terminate()
    child.wait(5)
    procs.children.remove((name, child))
    local_id = rid()
    local = await store.acquire(tenant, limits, tokens=0, request_id=local_id)
    assert local.is_allowed and local.is_local and store.is_redis_down
    assert await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                              request_id=local_id)  # released locally, not in Redis
    start_redis(procs, workdir, port)
    # Redis restarted empty, but the first request still runs: its lease is this store's, so
    # it still counts (Redis is told with the next op) and the slot stays taken.
    back = await store.acquire(tenant, limits, tokens=0, request_id=rid())
    assert not back.is_local and not store.is_redis_down
    assert back.refused_by == "concurrency" and back.num_leases == 1
    assert await held_async(client, tenant) == 1
    assert await store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                              request_id=first)
    again = await store.acquire(tenant, limits, tokens=0, request_id=rid())
    assert again.is_allowed and not again.is_local
    await client.aclose()


async def test_one_script_call_per_acquire(redis: aioredis.Redis, tenant: str) -> None:
    store = QuotaStore(redis, block_s=0)  # every acquire judged in Redis: no budget
    limits = QuotaLimits(requests_per_minute=1000, tokens_per_minute=10**6, max_concurrent=100)
    await redis.script_flush()
    await store.acquire(tenant, limits, tokens=5, request_id=rid())  # NOSCRIPT, then EVAL
    assert store.counters()["num_script_loads"] == 1
    before = await redis.info("commandstats")
    for _ in range(20):
        await store.acquire(tenant, limits, tokens=5, request_id=rid())
    after = await redis.info("commandstats")

    def calls(stats: dict[str, dict[str, int]], command: str) -> int:
        return stats.get(f"cmdstat_{command}", {}).get("calls", 0)

    assert calls(after, "evalsha") - calls(before, "evalsha") == 20
    assert calls(after, "eval") == calls(before, "eval")
    assert store.counters()["num_script_loads"] == 1


async def test_client_cpu_per_acquire(redis: aioredis.Redis, tenant: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Not a speed assertion: prints the client-side CPU per acquire, on the store's own
    connection and through redis-py (each request judged in Redis: no budget), next to a
    bare redis-py PING and to an acquire + settle pair spent from the tenant's budget."""
    store, num_calls = QuotaStore(redis, block_s=0), 2000
    via_redis_py = QuotaStore(redis, own_connection=False, block_s=0)
    budgeted = QuotaStore(redis)
    limits = QuotaLimits(requests_per_minute=10**6, tokens_per_minute=10**9,
                         max_concurrent=10**6)
    await store.acquire(tenant, limits, tokens=100, request_id=rid())
    await via_redis_py.acquire(tenant, limits, tokens=100, request_id=rid())

    async def measure(call: object) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(num_calls):
            await call()  # type: ignore[operator]
        return ((time.process_time() - cpu) / num_calls * 1e6,
                (time.perf_counter() - wall) / num_calls * 1e6)

    acquire_cpu, acquire_wall = await measure(
        lambda: store.acquire(tenant, limits, tokens=100, request_id=rid()))
    redis_py_cpu, redis_py_wall = await measure(
        lambda: via_redis_py.acquire(tenant, limits, tokens=100, request_id=rid()))
    ping_cpu, ping_wall = await measure(redis.ping)

    async def pair() -> None:
        request_id = rid()
        await budgeted.acquire(tenant, limits, tokens=100, request_id=request_id)
        budgeted.settle_soon(tenant, limits, reserved_tokens=100, actual_tokens=50,
                             request_id=request_id)

    pair_cpu, pair_wall = await measure(pair)
    assert budgeted.counters()["num_spent_here"] > num_calls // 2
    with capsys.disabled():
        print(f"\nquota acquire: {acquire_cpu:.0f} us client CPU, {acquire_wall:.0f} us wall "
              f"(through redis-py: {redis_py_cpu:.0f} us, {redis_py_wall:.0f} us); "
              f"PING: {ping_cpu:.0f} us CPU, {ping_wall:.0f} us wall; acquire + settle from "
              f"a budget: {pair_cpu:.0f} us CPU, {pair_wall:.0f} us wall ({num_calls} calls "
              f"each)")
    for closing in (store, via_redis_py, budgeted):
        await closing.aclose()


async def test_leases_cost_redis_no_command_of_their_own(redis: aioredis.Redis,
                                                         tenant: str) -> None:
    """A replica's leases are one field of the tenant's held hash, its count, whatever the
    number of requests; two replicas' counts add up, and an op older than the last one
    applied (a settle merged behind a newer acquire) does not set an old count."""
    limits = QuotaLimits(max_concurrent=3)
    one, two = QuotaStore(redis), QuotaStore(redis)
    first, second = rid(), rid()
    assert (await one.acquire(tenant, limits, tokens=0, request_id=first)).is_allowed
    assert (await one.acquire(tenant, limits, tokens=0, request_id=second)).is_allowed
    assert (await two.acquire(tenant, limits, tokens=0, request_id=rid())).num_leases == 3
    refused = await two.acquire(tenant, limits, tokens=0, request_id=rid())
    assert refused.refused_by == "concurrency" and refused.num_leases == 3
    fields = await redis.hgetall(quota_keys(tenant)[2])
    assert len(fields) == 2 and sorted(int(v.split()[0]) for v in fields.values()) == [1, 2]
    assert await one.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                            request_id=first)
    assert not await one.settle(tenant, limits, reserved_tokens=0, actual_tokens=0,
                                request_id=first)  # settled already: nothing released
    assert await held_async(redis, tenant) == 2
    # An old count (op number 1) after a newer one is ignored.
    [field] = [k for k in fields if k.decode() == one.replica_id]
    stale = await redis.evalsha(OPS_SCRIPT.sha, 3, *quota_keys(tenant), 60_000, 1000,
                                field.decode(), "H", 1, 0)
    assert stale == b"1" and await held_async(redis, tenant) == 2
    await one.aclose()
    await two.aclose()
