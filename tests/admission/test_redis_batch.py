"""Script calls coalesced per loop iteration, on real redis-servers (one, and a two-node cluster).

The batching tests turn off ``send_idle_calls_at_once`` (a call made while nothing is out goes at
once, from its caller's task) so that a burst is exactly one pipeline; the last test covers it.

Round trips are counted twice: by the store (``num_redis_round_trips``) and by the server: a
batch that fits one 16 KB socket read (Redis's read size) is one read and one reply write in
``INFO stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from admission.quota.lua import OPS_SCRIPT
from admission.quota.pipe import MAX_MERGED_OPS, ScriptPipe
from admission.quota.redis_batch import ScriptBatcher
from admission.quota.redis_pipe import RespScriptPipe
from admission.quota.store import FailMode, QuotaLimits, QuotaStore, ops_keys, quota_keys
from backends.resp import RespAddress
from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    redis_server_path,
    start_redis,
)
from tests.admission.held import held_async


@pytest.fixture
async def redis(private_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis_url)
    yield client
    await client.aclose()


def rid() -> str:
    return uuid.uuid4().hex


def new_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def server_counts(client: aioredis.Redis) -> tuple[int, int, int, int]:
    """EVALSHA calls, EVAL calls, socket reads and reply writes of the server so far."""
    commands = await client.info("commandstats")
    stats = await client.info("stats")
    return (commands.get("cmdstat_evalsha", {}).get("calls", 0),
            commands.get("cmdstat_eval", {}).get("calls", 0),
            int(stats["total_reads_processed"]), int(stats["total_writes_processed"]))


class ServerCounts:
    """What the server did between ``start`` and ``stop``, less the INFO calls themselves."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._noise: tuple[int, ...] = (0, 0, 0, 0)
        self._before = self._noise

    async def start(self) -> None:
        first = await server_counts(self._client)
        self._before = await server_counts(self._client)
        self._noise = tuple(b - a for a, b in zip(first, self._before, strict=True))

    async def stop(self) -> tuple[int, int, int, int]:
        after = await server_counts(self._client)
        evalsha, evals, reads, writes = (
            a - b - n for a, b, n in zip(after, self._before, self._noise, strict=True))
        return evalsha, evals, reads, writes


async def warm(store: QuotaStore, num_calls: int = 1, tenant: str | None = None) -> None:
    """Load the scripts and open the pooled connections before counting."""
    limits, tenant = QuotaLimits(requests_per_minute=10**6), tenant or new_tenant()
    await asyncio.gather(
        *(store.acquire(tenant, limits, tokens=0, request_id=rid()) for _ in range(num_calls)),
        store.settle(tenant, limits, reserved_tokens=0, actual_tokens=0, request_id=rid()),
        store.renew(tenant, rid()))


@pytest.fixture(params=[pytest.param(True, id="own-connection"),
                        pytest.param(False, id="redis-py")])
def own_connection(request: pytest.FixtureRequest) -> bool:
    """Every test runs on the store's own connection (admission/quota/redis_pipe.py) and through
    redis-py (admission/quota/redis_batch.py): the same scheduling, two transports."""
    return bool(request.param)


def batching_store(client: aioredis.Redis | RedisCluster, **options: Any) -> QuotaStore:
    """A store whose every call goes through the batch (none sent at once when idle), with
    2 s for Redis to answer unless a test says otherwise: on a loaded 2-core machine the
    default 0.25 s has run out, and the store failed open (a flake, not what these test)."""
    return QuotaStore(client, send_idle_calls_at_once=False, **{"timeout_s": 2.0, **options})


def round_trips(store: QuotaStore) -> int:
    return store.counters()["num_redis_round_trips"]


async def test_one_batch_is_one_read_and_one_write_in_redis(redis: aioredis.Redis,
                                                            own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection)
    await warm(store, num_calls=32)
    limits, tenant, server = QuotaLimits(requests_per_minute=20), new_tenant(), ServerCounts(redis)
    trips_before = round_trips(store)
    await server.start()
    decisions = await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                                       for _ in range(32)))
    # One tenant's 32 acquires are one merged EVALSHA: one script run, one read, one write.
    assert await server.stop() == (1, 0, 1, 1)  # EVALSHA calls, EVAL calls, reads, writes
    assert round_trips(store) - trips_before == 1
    assert [d.is_allowed for d in decisions] == [True] * 20 + [False] * 12


@pytest.mark.parametrize(("max_batch_size", "num_round_trips"),
                         [pytest.param(256, 1, id="one-pipeline"),
                          pytest.param(32, 3, id="split-in-three")])
async def test_concurrent_acquires_are_exact(redis: aioredis.Redis, max_batch_size: int,
                                             num_round_trips: int, own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection,
                           max_batch_size=max_batch_size)
    await warm(store, num_calls=80)
    limits, tenant, server = QuotaLimits(requests_per_minute=50), new_tenant(), ServerCounts(redis)
    trips_before = round_trips(store)
    await server.start()
    decisions = await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                                       for _ in range(80)))
    assert (await server.stop())[:2] == (num_round_trips, 0)  # one merged EVALSHA per write
    assert round_trips(store) - trips_before == num_round_trips
    # The same answers as 80 sequential calls: the first 50 in, counting down, then refusals.
    sequential_tenant = new_tenant()
    sequential = [await store.acquire(sequential_tenant, limits, tokens=0, request_id=rid())
                  for _ in range(80)]
    for decision in (decisions, sequential):
        assert [d.is_allowed for d in decision] == [True] * 50 + [False] * 30
        assert [d.remaining_requests for d in decision[:50]] == list(range(49, -1, -1))
        assert {d.refused_by for d in decision[50:]} == {"requests"}
        assert not any(d.is_local for d in decision)


async def test_acquires_settles_and_renews_of_many_tenants_share_a_round_trip(
        redis: aioredis.Redis, own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection)
    await warm(store)
    limits = QuotaLimits(tokens_per_minute=1000, max_concurrent=2)
    tenants = [new_tenant() for _ in range(3)]
    held = {tenant: [rid(), rid()] for tenant in tenants}
    for tenant, request_ids in held.items():
        for request_id in request_ids:
            decision = await store.acquire(tenant, limits, tokens=400, request_id=request_id)
            assert decision.is_allowed
    trips_before = round_trips(store)
    settled, renewed, acquired = await asyncio.gather(
        asyncio.gather(*(store.settle(t, limits, reserved_tokens=400, actual_tokens=100,
                                      request_id=ids[0]) for t, ids in held.items())),
        asyncio.gather(*(store.renew(t, ids[1]) for t, ids in held.items())),
        asyncio.gather(*(store.acquire(t, limits, tokens=100, request_id=rid())
                         for t in tenants)),
    )
    assert round_trips(store) - trips_before == 1
    assert settled == [True] * 3 and renewed == [True] * 3
    # Every call ran in the order it was made: the acquires came after the settles were queued
    # but in the same pipeline, so they see the refund and the freed slot.
    assert all(d.is_allowed and d.num_leases == 2 for d in acquired)
    assert all(400 <= (d.remaining_tokens or 0) <= 405 for d in acquired)  # 1000 - 500 - 100


async def test_noscript_inside_a_batch_is_sent_again_with_eval(redis: aioredis.Redis,
                                                               own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection)
    limits = QuotaLimits(requests_per_minute=100)
    await warm(store)
    await redis.script_flush()
    loads_before = store.counters()["num_script_loads"]  # warm's own, if a test flushed before
    tenant, server = new_tenant(), ServerCounts(redis)
    await server.start()
    decisions = await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                                       for _ in range(20)))
    assert [d.remaining_requests for d in decisions] == list(range(99, 79, -1))
    assert not any(d.is_local for d in decisions) and not store.is_redis_down
    assert (await server.stop())[1] == 1  # the 20 merged acquires, sent again as one EVAL
    assert store.counters()["num_script_loads"] - loads_before == 1
    trips_before = round_trips(store)
    await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                           for _ in range(20)))
    assert round_trips(store) - trips_before == 1
    assert store.counters()["num_script_loads"] - loads_before == 1
    assert store.counters()["num_redis_errors"] == 0


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_redis_killed_mid_batch_fails_every_caller_promptly(
        procs: ProcessGroup, workdir: Path, fail_mode: FailMode, own_connection: bool) -> None:
    port = free_port()
    client = aioredis.Redis.from_url(start_redis(procs, workdir, port))
    store = batching_store(client, own_connection=own_connection, fail_mode=fail_mode,
                           timeout_s=2.0)
    await warm(store)
    pauser = aioredis.Redis(host="127.0.0.1", port=port)
    await pauser.execute_command("CLIENT", "PAUSE", 10_000, "ALL")  # the batch hangs in Redis
    limits, tenant = QuotaLimits(requests_per_minute=1000), new_tenant()
    trips_before = round_trips(store)
    calls = [asyncio.create_task(store.acquire(tenant, limits, tokens=0, request_id=rid()))
             for _ in range(20)]
    await asyncio.sleep(0.1)
    assert round_trips(store) == trips_before + 1  # sent, stuck in Redis
    name, child = next(c for c in procs.children if c[0] == f"redis-{port}")
    killed_at = time.perf_counter()
    child.send_signal(signal.SIGKILL)
    child.wait(5)
    procs.children.remove((name, child))
    decisions = await asyncio.gather(*calls)
    assert time.perf_counter() - killed_at < 0.5  # the lost connection, not the timeout
    assert store.is_redis_down and store.counters()["num_outages"] == 1
    if fail_mode == "open":
        assert all(d.is_allowed and d.is_local for d in decisions)
        assert store.counters()["num_fail_open"] == 20
    else:
        assert {(d.http_status, d.refused_by) for d in decisions} == {(503, "unavailable")}
        assert store.counters()["num_fail_closed"] == 20
    with contextlib.suppress(Exception):
        await pauser.aclose()
    await client.aclose()


async def test_calls_wait_while_pipelines_are_out_then_leave_together(
        redis: aioredis.Redis, own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection, timeout_s=2.0,
                           max_in_flight=1)
    await warm(store)
    limits, tenant = QuotaLimits(requests_per_minute=100), new_tenant()
    trips_before = round_trips(store)
    await redis.execute_command("CLIENT", "PAUSE", 2_000, "WRITE")  # scripts wait in Redis
    first = [asyncio.create_task(store.acquire(tenant, limits, tokens=0, request_id=rid()))
             for _ in range(5)]
    await asyncio.sleep(0.05)
    later = []
    for _ in range(5):  # five loop iterations, two calls each
        later += [asyncio.create_task(store.acquire(tenant, limits, tokens=0, request_id=rid()))
                  for _ in range(2)]
        await asyncio.sleep(0.01)
    assert round_trips(store) - trips_before == 1
    await redis.execute_command("CLIENT", "UNPAUSE")
    decisions = await asyncio.gather(*first, *later)
    assert round_trips(store) - trips_before == 2  # the ten waiting calls went out together
    assert [d.remaining_requests for d in decisions] == list(range(99, 84, -1))


async def test_cancelled_callers_leave_the_others_unaffected(redis: aioredis.Redis,
                                                             own_connection: bool) -> None:
    store = batching_store(redis, own_connection=own_connection, timeout_s=2.0)
    limits = QuotaLimits(requests_per_minute=10)
    await warm(store)
    tenant, server = new_tenant(), ServerCounts(redis)
    await server.start()
    # Cancelled before its batch is sent: it is left out and charges nothing.
    calls = [asyncio.create_task(store.acquire(tenant, limits, tokens=0, request_id=rid()))
             for _ in range(5)]
    await asyncio.sleep(0)  # every call is queued; the sender runs next
    calls[2].cancel()
    others = await asyncio.gather(*calls[:2], *calls[3:])
    assert calls[2].cancelled()
    assert [d.remaining_requests for d in others] == [9, 8, 7, 6]
    assert (await server.stop())[0] == 1  # the four left, merged
    # Cancelled while its batch is in Redis: it is charged, everyone else gets their answer.
    await redis.execute_command("CLIENT", "PAUSE", 2_000, "WRITE")
    calls = [asyncio.create_task(store.acquire(tenant, limits, tokens=0, request_id=rid()))
             for _ in range(5)]
    await asyncio.sleep(0.05)
    calls[0].cancel()
    await redis.execute_command("CLIENT", "UNPAUSE")
    others = await asyncio.gather(*calls[1:])
    assert calls[0].cancelled()
    assert [d.remaining_requests for d in others] == [4, 3, 2, 1]
    assert not any(d.is_local for d in others) and store.counters()["num_redis_errors"] == 0
    assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).remaining_requests == 0


@pytest.fixture(scope="module")
async def cluster(procs: ProcessGroup, workdir: Path) -> AsyncIterator[list[int]]:
    """Two redis-server nodes in cluster mode, half the slots each."""
    first = free_port_range(4)  # two client ports, two cluster-bus ports (not port + 10000)
    ports = [first, first + 1]
    for port in ports:
        procs.spawn(f"redis-cluster-{port}", [
            redis_server_path(), "--port", str(port), "--cluster-port", str(port + 2),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir),
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
            "--loglevel", "warning"])
    nodes = [aioredis.Redis(host="127.0.0.1", port=port) for port in ports]
    deadline = time.monotonic() + 10
    for node in nodes:
        while True:
            try:
                await node.ping()
                break
            except (OSError, RedisConnectionError):
                assert time.monotonic() < deadline, "cluster nodes did not start"
                await asyncio.sleep(0.05)
    await nodes[0].execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
    await nodes[1].execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
    await nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", ports[1], ports[1] + 2)
    while True:
        infos = [await node.execute_command("CLUSTER", "INFO") for node in nodes]
        if all(b"cluster_state:ok" in info and b"cluster_known_nodes:2" in info
               for info in infos):
            break
        assert time.monotonic() < deadline, f"cluster did not form: {infos}"
        await asyncio.sleep(0.05)
    for node in nodes:
        await node.aclose()
    yield ports


async def test_cluster_pipelines_by_node(cluster: list[int]) -> None:
    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in cluster])
    nodes = [aioredis.Redis(host="127.0.0.1", port=port) for port in cluster]
    store, limits = batching_store(client, timeout_s=2.0), QuotaLimits(requests_per_minute=5)
    tenants = [tenant_on(client, is_low) for is_low in (True, False) * 4]
    # Scripts loaded and a connection open on both nodes.
    await asyncio.gather(*(warm(store, tenant=tenant_on(client, is_low))
                           for is_low in (True, False)))
    servers = [ServerCounts(node) for node in nodes]
    for server in servers:
        await server.start()
    trips_before = round_trips(store)
    decisions = await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                                       for tenant in tenants for _ in range(7)))
    counts = [await server.stop() for server in servers]
    assert round_trips(store) - trips_before == 1  # one pipeline per node, sent together
    assert sum(evalsha for evalsha, *_ in counts) == 8  # each tenant's 7 merged into one
    assert [(reads, writes) for _, _, reads, writes in counts] == [(1, 1), (1, 1)]
    for i in range(8):
        mine = decisions[i * 7:(i + 1) * 7]
        assert [d.remaining_requests for d in mine[:5]] == [4, 3, 2, 1, 0]
        assert [d.refused_by for d in mine[5:]] == ["requests", "requests"]
    assert not any(d.is_local for d in decisions) and store.counters()["num_redis_errors"] == 0
    loads_before = store.counters()["num_script_loads"]
    for node in nodes:
        await node.script_flush()
    again = await asyncio.gather(*(store.acquire(t, limits, tokens=0, request_id=rid())
                                   for t in tenants))
    assert {d.refused_by for d in again} == {"requests"}
    assert store.counters()["num_script_loads"] - loads_before == 8  # one per tenant
    assert store.counters()["num_redis_errors"] == 0
    for node in nodes:
        await node.aclose()
    await client.aclose()


def tenant_on(client: RedisCluster, is_low: bool) -> str:
    """A new tenant whose keys live on the first node (``is_low``) or the second."""
    while (client.keyslot(quota_keys(tenant := new_tenant())[0]) < 8192) != is_low:
        pass
    return tenant


async def test_an_idle_store_sends_a_lone_call_at_once_and_batches_the_rest(
        redis: aioredis.Redis, own_connection: bool) -> None:
    """With nothing out, a call goes at once, as a plain EVALSHA; calls made while it is out
    leave together in one pipeline after it."""
    store = QuotaStore(redis, own_connection=own_connection)
    await warm(store)
    limits, tenant = QuotaLimits(requests_per_minute=100), new_tenant()
    trips_before = round_trips(store)
    assert (await store.acquire(tenant, limits, tokens=0, request_id=rid())).is_allowed
    assert round_trips(store) - trips_before == 1
    decisions = await asyncio.gather(*(store.acquire(tenant, limits, tokens=0, request_id=rid())
                                       for _ in range(20)))
    assert round_trips(store) - trips_before == 3  # the first of the burst, then the other 19
    assert sorted(d.remaining_requests or 0 for d in decisions) == list(range(79, 99))


async def test_a_settle_rides_with_the_next_acquire_or_leaves_after_its_delay(
        redis: aioredis.Redis, own_connection: bool) -> None:
    """One lease (max_concurrent 1): the settle waits for the next acquire and goes first in
    the same round trip, so that acquire gets the lease; a settle with nothing to ride with
    leaves on its own once its delay is up."""
    store = QuotaStore(redis, own_connection=own_connection, settle_delay_s=0.3)
    await warm(store)
    limits, tenant = QuotaLimits(max_concurrent=1), new_tenant()
    first = rid()
    assert (await store.acquire(tenant, limits, tokens=10, request_id=first)).is_allowed
    trips_before = round_trips(store)
    settling = asyncio.create_task(store.settle(tenant, limits, reserved_tokens=10,
                                                actual_tokens=7, request_id=first))
    await asyncio.sleep(0.05)
    assert not settling.done() and round_trips(store) == trips_before  # held back
    second = rid()
    assert (await store.acquire(tenant, limits, tokens=10, request_id=second)).is_allowed
    assert await settling
    assert round_trips(store) == trips_before + 1  # the settle and the acquire together

    started_s = time.monotonic()
    assert await store.settle(tenant, limits, reserved_tokens=10, actual_tokens=3,
                              request_id=second)
    assert 0.25 <= time.monotonic() - started_s < 2.0
    assert round_trips(store) == trips_before + 2
    assert await held_async(redis, tenant) == 0  # no lease left behind


async def test_aclose_sends_the_deferred_settles(redis: aioredis.Redis,
                                                  own_connection: bool) -> None:
    # A settle deferred for 30 s (waiting for an acquire to ride with) would hold its lease
    # until the TTL if closing dropped it; aclose sends it first, on both transports.
    store = QuotaStore(redis, own_connection=own_connection, settle_delay_s=30.0)
    limits, tenant = QuotaLimits(max_concurrent=1), new_tenant()
    request_id = rid()
    assert (await store.acquire(tenant, limits, tokens=0, request_id=request_id)).is_allowed
    assert await held_async(redis, tenant) == 1
    store.settle_soon(tenant, limits, reserved_tokens=0, actual_tokens=0, request_id=request_id)
    await asyncio.sleep(0.05)
    assert await held_async(redis, tenant) == 1  # still deferred

    await store.aclose()

    assert await held_async(redis, tenant) == 0
    other = QuotaStore(redis, own_connection=own_connection)
    assert (await other.acquire(tenant, limits, tokens=0, request_id=rid())).is_allowed
    await other.aclose()


def acquire_op(rpm: int, tpm: int, max_concurrent: int, tokens: int, seq: int,
               held: int) -> tuple[str | int, ...]:
    """An acquire op as the store sends it without a budget: no credit back, no block."""
    return ("A", rpm, tpm, max_concurrent, tokens, seq, held, held + 1, 0, 0, 0, 0, 0)


def transport(client: aioredis.Redis, own_connection: bool) -> ScriptPipe:
    if own_connection:
        address = RespAddress.of(client)
        assert address is not None
        return RespScriptPipe(address, timeout_s=2.0, send_idle_calls_at_once=False)
    return ScriptBatcher(client, timeout_s=2.0, send_idle_calls_at_once=False)


async def test_a_merged_command_answers_each_op_as_sequential_calls_would(
        redis: aioredis.Redis, own_connection: bool) -> None:
    """One tenant's ops of one iteration are one EVALSHA, applied in order: the third acquire
    finds both slots taken, the settle frees one, the fourth acquire takes it; a count op of
    a replica whose count is live says 1. A bad op fails only its own command's callers."""
    pipe = transport(redis, own_connection)
    header = (60_000, 1000, "replica-a")
    keys, other_keys = ops_keys(new_tenant()), ops_keys(new_tenant())
    await pipe.run(OPS_SCRIPT, other_keys, (*header, "H", 1, 0))  # connected, script loaded
    server = ServerCounts(redis)
    await server.start()
    # As the store sends them: each op numbered, with this replica's count of leases then.
    ops = [acquire_op(0, 1000, 2, 100, 1, 0), acquire_op(0, 1000, 2, 100, 2, 1),
           acquire_op(0, 1000, 2, 100, 3, 2), ("S", 1000, 100, 40, 4, 1),
           acquire_op(0, 1000, 2, 100, 5, 1), ("H", 6, 2)]
    futures = [pipe.call(OPS_SCRIPT, keys, (*header, *op)) for op in ops]
    bad = pipe.call(OPS_SCRIPT, other_keys, (*header, "X", "oops"))
    fine = pipe.call(OPS_SCRIPT, ops_keys(new_tenant()), (*header, "H", 1, 0))
    replies = [await future for future in futures]
    assert (await server.stop())[0] == 3  # the tenant's six ops, the bad one, the other one
    fields = [reply.split() for reply in replies]
    assert fields[0][:2] == [b"1", b"0"] and fields[0][7] == b"1"
    assert fields[1][:2] == [b"1", b"0"] and fields[1][7] == b"2"
    assert fields[2][:2] == [b"0", b"3"]  # refused: concurrency
    assert replies[3] == b"1"  # the count without the first lease, 60 tokens refunded
    assert fields[4][:2] == [b"1", b"0"] and fields[4][7] == b"2"
    assert int(fields[4][5]) == 1000 - 100 - 40 - 100  # remaining tokens, in order
    assert replies[5] == b"1"
    with pytest.raises(ResponseError, match="unknown quota op"):
        await bad
    assert await fine == b"0"
    await pipe.aclose()


async def test_ops_beyond_the_merge_bound_go_in_more_commands(redis: aioredis.Redis,
                                                              own_connection: bool) -> None:
    pipe = transport(redis, own_connection)
    header, keys = (60_000, 1000, "replica-a"), ops_keys(new_tenant())
    await pipe.run(OPS_SCRIPT, keys, (*header, "H", 1, 0))
    server = ServerCounts(redis)
    await server.start()
    count = 2 * MAX_MERGED_OPS + 1
    futures = [pipe.call(OPS_SCRIPT, keys, (*header, *acquire_op(count, 0, 0, 0, 0, 0)))
               for _ in range(count)]
    replies = [await future for future in futures]
    assert (await server.stop())[0] == 3
    remaining = [int(reply.split()[3]) for reply in replies]
    assert remaining == list(range(count - 1, -1, -1))  # one GCRA, charged in call order
    await pipe.aclose()
