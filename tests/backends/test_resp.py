"""backends.resp: a plain RESP connection against a real private redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import hiredis
import pytest
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from backends.resp import RespAddress, RespConnection, pack_command


@pytest.fixture
async def redis(private_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis_url)
    await client.flushall()
    yield client
    await client.aclose()


def _conn(redis: aioredis.Redis, timeout_s: float = 2.0) -> RespConnection:
    address = RespAddress.of(redis)
    assert address is not None
    return RespConnection(address, timeout_s=timeout_s)


def test_commands_are_packed_as_resp_arrays_of_bulk_strings() -> None:
    assert pack_command(("SET", "k", b"\x00v", 5, 0.5)) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00v\r\n$1\r\n5\r\n$3\r\n0.5\r\n")


@pytest.mark.parametrize("parts", [
    pytest.param(("PING",), id="one-word"),
    pytest.param(("EVALSHA", "ab" * 20, 3, "sy:quota:{t}:req", "k2", "k3", 600, 0, -1),
                 id="ints-and-negative"),
    pytest.param(("SET", "clé", "naïve\r\n$3\r\n"), id="utf8-and-crlf-inside"),
    pytest.param(("SET", b"\x00\xff", ""), id="bytes-and-empty"),
])
def test_packed_commands_parse_back_as_resp_arrays(parts: tuple[str | int | bytes, ...]) -> None:
    reader = hiredis.Reader()
    reader.feed(pack_command(parts))
    expected = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    assert reader.gets() == expected
    assert reader.gets() is False


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://10.1.2.3:6380/4", RespAddress(host="10.1.2.3", port=6380, db=4)),
    ("redis://u:pw@localhost/0", RespAddress(host="localhost", username="u", password="pw")),
    ("unix:///run/redis.sock?db=2", RespAddress(path="/run/redis.sock", db=2)),
    ("rediss://10.1.2.3:6380", None),  # TLS: redis-py keeps it
])
async def test_the_address_of_a_plain_client_and_none_of_others(
        url: str, expected: RespAddress | None) -> None:
    client = aioredis.Redis.from_url(url)
    assert RespAddress.of(client) == expected
    await client.aclose()
    assert RespAddress.of(object()) is None


async def test_pipelined_replies_come_back_in_order(redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    replies = await conn.pipeline([("SET", "a", "1"), ("INCRBY", "a", 41), ("GET", "a"),
                                   ("GET", "missing"), ("XADD", "s", "*", "f", b"\xff")])
    assert replies[:4] == [b"OK", 42, b"42", None]
    assert (await redis.xrange("s"))[0][1] == {b"f": b"\xff"}
    assert await conn.pipeline([]) == []
    await conn.aclose()


async def test_an_error_reply_goes_to_its_caller_and_the_connection_stays(
        redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    await redis.set("text", "not a number")
    with pytest.raises(ResponseError, match="not an integer"):
        await conn.pipeline([("GET", "text"), ("INCR", "text")])
    assert await conn.call(("GET", "text")) == b"not a number"
    assert conn.num_connects == 1
    await conn.aclose()


async def test_a_blocking_read_is_woken_by_an_add(redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    read = asyncio.create_task(conn.call(("XREAD", "BLOCK", 5000, "STREAMS", "s", "$"),
                                         timeout_s=6))
    await asyncio.sleep(0.1)
    await redis.xadd("s", {"k": "v"})
    ((stream, entries),) = await asyncio.wait_for(read, 2)
    assert stream == b"s" and entries[0][1] == [b"k", b"v"]
    assert await conn.call(("XREAD", "BLOCK", 10, "STREAMS", "s", "$")) is None  # timed out
    await conn.aclose()


async def test_a_transaction_answers_a_blocked_reader_once_with_every_add(
        redis: aioredis.Redis) -> None:
    """In a plain pipeline Redis answers a blocked XREAD after the first XADD, and the reader
    must ask again for the rest; in a transaction, after the last."""
    writer, reader = _conn(redis), _conn(redis)
    for send in (writer.pipeline, writer.transaction):
        read = asyncio.create_task(reader.xread({"s": "$"}, count=10, block_ms=5000))
        await asyncio.sleep(0.1)
        ids = await send([("XADD", "s", "*", "n", str(i)) for i in range(3)])
        ((_, entries),) = await asyncio.wait_for(read, 2)
        expected = ids[:1] if send == writer.pipeline else ids
        assert [entry_id for entry_id, _ in entries] == expected
    assert await writer.transaction([]) == []
    await writer.aclose()
    await reader.aclose()


async def test_an_error_inside_a_transaction_raises_and_the_rest_ran(
        redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    await redis.set("text", "not a number")
    with pytest.raises(ResponseError, match="not an integer"):
        await conn.transaction([("SET", "a", "1"), ("INCR", "text"), ("SET", "b", "2")])
    assert await redis.mget("a", "b") == [b"1", b"2"]  # EXEC does not roll back
    assert conn.num_connects == 1
    await conn.aclose()


async def test_xread_reads_several_streams_in_redis_py_shape_and_waits_past_its_block(
        redis: aioredis.Redis) -> None:
    conn = _conn(redis, timeout_s=0.3)
    first = await redis.xadd("a", {"k": "1"})
    read = asyncio.create_task(conn.xread({"a": "0", "b": "$"}, count=10, block_ms=500))
    assert await asyncio.wait_for(read, 2) == [(b"a", [(first, {b"k": b"1"})])]
    # Nothing to read: the answer comes after the 600 ms block (Redis may be 100 ms late),
    # past the 300 ms timeout, and that is no timeout (the block is added to it).
    assert await conn.xread({"a": first}, count=10, block_ms=600) == []
    assert conn.num_connects == 1
    await conn.aclose()


async def test_a_late_answer_closes_the_connection_and_the_next_call_reconnects(
        redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    with pytest.raises(RedisTimeoutError):
        await conn.call(("BLPOP", "nothing-here", "0.3"), timeout_s=0.05)
    assert not conn.is_connected
    await asyncio.sleep(0.3)
    assert await conn.call(("PING",)) == b"PONG"
    assert conn.num_connects == 2
    await conn.aclose()


async def test_a_lost_connection_fails_its_calls_and_the_next_one_reconnects(
        redis: aioredis.Redis) -> None:
    conn = _conn(redis)
    await conn.call(("CLIENT", "SETNAME", "resp-under-test"))
    read = asyncio.create_task(conn.call(("XREAD", "BLOCK", 5000, "STREAMS", "s", "$"),
                                         timeout_s=6))
    await asyncio.sleep(0.1)
    clients = await redis.client_list()
    (victim,) = [c for c in clients if c["name"] == "resp-under-test"]
    await redis.client_kill_filter(_id=victim["id"])
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(read, 2)
    assert await conn.call(("PING",)) == b"PONG"
    assert conn.num_connects == 2
    await conn.aclose()


async def test_nothing_listening_is_a_connection_error(redis: aioredis.Redis) -> None:
    conn = RespConnection(RespAddress(port=1), timeout_s=0.5)
    with pytest.raises(RedisConnectionError, match="cannot reach Redis"):
        await conn.call(("PING",))
    assert not conn.is_connected


async def test_auth_and_select(redis: aioredis.Redis) -> None:
    port = redis.connection_pool.connection_kwargs["port"]
    await redis.config_set("requirepass", "s3cret")
    try:
        client = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/5")
        conn = _conn(client)
        assert await conn.call(("SET", "in-five", "1")) == b"OK"
        await conn.aclose()
        assert await client.get("in-five") == b"1"
        await client.aclose()
        wrong = aioredis.Redis.from_url(f"redis://:nope@127.0.0.1:{port}/5")
        with pytest.raises(RedisConnectionError, match="cannot reach Redis"):
            await _conn(wrong).call(("PING",))
        await wrong.aclose()
    finally:
        authed = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}")
        await authed.config_set("requirepass", "")
        await authed.aclose()
    assert await redis.exists("in-five") == 0  # not in database 0


def test_it_runs_on_uvloop(private_redis_url: str) -> None:
    """The gateway's loop: uvloop's transports are no asyncio.Transport subclasses."""
    async def ping() -> object:
        client = aioredis.Redis.from_url(private_redis_url)
        conn = _conn(client)
        try:
            return await conn.pipeline([("PING",), ("ECHO", "uv")])
        finally:
            await conn.aclose()
            await client.aclose()

    assert uvloop.run(ping()) == [b"PONG", b"uv"]
