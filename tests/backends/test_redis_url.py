"""The Redis URL forms: plain, Sentinel and Cluster, and the errors that say what to change;
the loops that outlive Redis errors end when cancelled."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from backends.redis_url import (
    REDIS_ERRORS,
    RedisUrlError,
    cluster_parts,
    is_cluster,
    raise_if_cancelled,
    redis_from_url,
    sentinel_parts,
)


def test_cluster_nodes_credentials_and_tls() -> None:
    nodes, options = cluster_parts("rediss+cluster://app:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002")
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)]
    assert options == {"username": "app", "password": "p@ss", "ssl": True}
    assert cluster_parts("redis+cluster://h:1/0") == ([("h", 1)], {})


@pytest.mark.parametrize(("url", "message"), [
    ("redis+cluster://h:1/2", "only database 0"),
    ("redis+cluster://h:x", "node port 'x' is not a number"),
    ("redis+cluster://h:1,,h:2", "a node has no host"),
    ("redis+cluster://h:1?read_from_replicas=1", "this form takes none"),
])
def test_bad_cluster_urls(url: str, message: str) -> None:
    with pytest.raises(RedisUrlError) as info:
        cluster_parts(url)
    assert message in str(info.value)


def test_a_password_never_shows_in_an_error() -> None:
    with pytest.raises(RedisUrlError) as info:
        cluster_parts("redis+cluster://u:secret@h:x")
    assert "secret" not in str(info.value) and "u:***@" in str(info.value)


def test_sentinel_parts_are_unchanged() -> None:
    sentinels, service, db, primary, own = sentinel_parts(
        "redis+sentinel://:pw@s1,s2:26380/mymaster/2?sentinel_password=sp")
    assert sentinels == [("s1", 26379), ("s2", 26380)]
    assert (service, db, primary, own) == ("mymaster", 2, {"password": "pw"}, {"password": "sp"})


async def test_the_client_of_each_form() -> None:
    cluster = redis_from_url("redis+cluster://127.0.0.1:7000", socket_timeout=1.0)
    plain = redis_from_url("redis://127.0.0.1:6379/0")
    try:
        assert is_cluster(cluster) and not is_cluster(plain)
        assert isinstance(plain, aioredis.Redis)
    finally:
        await cluster.aclose()
        await plain.aclose()


async def test_a_loop_that_outlives_redis_errors_still_ends_when_cancelled() -> None:
    """redis-py may turn a cancellation inside a command into a connection error; the loops
    that log and retry Redis errors end all the same."""
    attempts = 0

    async def command() -> None:  # as redis-py does when cancelled mid-command
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RedisConnectionError("Connection closed by server.") from None

    async def loop() -> None:
        nonlocal attempts
        while True:
            attempts += 1
            try:
                await command()
            except REDIS_ERRORS:
                raise_if_cancelled()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert attempts == 1
    raise_if_cancelled()  # this task was not cancelled: nothing raised
