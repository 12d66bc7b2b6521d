"""bench.replicas' round-robin front on loopback: connections dealt in turn, a replica that
refuses skipped, bytes relayed both ways, the connection bound kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bench.replicas.balancer import HOST, RoundRobinFront
from gateway.cli.localproc import free_port


async def _named_server(name: bytes) -> asyncio.Server:
    """Answers every line it reads with ``name: line``."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(name + b": " + line)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, HOST, 0)


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


@pytest.fixture
async def replicas() -> AsyncIterator[list[int]]:
    servers = [await _named_server(name) for name in (b"a", b"b", b"c")]
    yield [_port(s) for s in servers]
    for server in servers:
        server.close()
        await server.wait_closed()


async def _ask(port: int, line: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(line + b"\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    await writer.wait_closed()
    return answer


async def _front(ports: list[int], **kwargs: int) -> tuple[RoundRobinFront, asyncio.Server]:
    front = RoundRobinFront(ports, **kwargs)
    server = await asyncio.get_running_loop().create_server(front.client_side, HOST, 0)
    return front, server


async def test_each_connection_goes_to_the_next_replica(replicas: list[int]) -> None:
    _, server = await _front(replicas)
    async with server:
        answers = [await _ask(_port(server), b"hi") for _ in range(4)]
    assert answers == [b"a: hi\n", b"b: hi\n", b"c: hi\n", b"a: hi\n"]


async def test_a_replica_that_refuses_is_skipped(replicas: list[int]) -> None:
    _, server = await _front([replicas[0], free_port(), replicas[2]])
    async with server:
        answers = [await _ask(_port(server), b"x") for _ in range(3)]
    assert answers == [b"a: x\n", b"c: x\n", b"c: x\n"]


async def test_connections_over_the_bound_are_closed(replicas: list[int]) -> None:
    front, server = await _front(replicas, max_connections=1)
    async with server:
        reader, writer = await asyncio.open_connection(HOST, _port(server))
        writer.write(b"held\n")
        assert await reader.readline() == b"a: held\n"
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            answer = await _ask(_port(server), b"more")
            if not answer:
                raise asyncio.IncompleteReadError(b"", None)
        assert front.num_refused == 1
        writer.close()
        await writer.wait_closed()


async def test_a_client_leaving_closes_the_replica_side_too() -> None:
    """An HTTP server keeps a half-closed idle connection open (keep-alive): the front must
    not wait for it, or connections pile up until the bound refuses new ones."""
    held = asyncio.Event()

    async def keeps_open(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"k: " + await reader.readline())
        await writer.drain()
        await reader.read()  # the client's EOF
        held.set()
        await asyncio.sleep(3600)  # and never close

    replica = await asyncio.start_server(keeps_open, HOST, 0)
    front, server = await _front([_port(replica)])
    async with server:
        assert await _ask(_port(server), b"bye") == b"k: bye\n"
        await asyncio.wait_for(held.wait(), 5)
        for _ in range(100):
            if front.num_open == 0:
                break
            await asyncio.sleep(0.01)
        assert front.num_open == 0
    replica.close()
