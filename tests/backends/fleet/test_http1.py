"""The hot-path HTTP/1.1 client (``backends.fleet.http1``) against real servers on loopback.

Each test runs a small asyncio server that answers as the test scripts it (keep-alive, chunks,
a close before the answer, garbage), so what the client does on the wire is observed from the
server's side: how many connections it opened, what it sent, when it hung up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from backends.fleet import http1
from backends.fleet.http1 import Pool, UpstreamBroken
from backends.fleet.registry import Backend
from backends.fleet.upstream import UpstreamClient, UpstreamFailure

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    handler: Handler
    port: int = 0
    num_connections: int = 0
    max_open: int = 0
    num_open: int = 0
    requests: list[bytes] = field(default_factory=list)
    disconnects: int = 0
    server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        self.num_open += 1
        self.max_open = max(self.max_open, self.num_open)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnects += 1
        finally:
            self.num_open -= 1
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request (head and Content-Length body), or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


@contextlib.asynccontextmanager
async def running(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = server.server.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        server.server.close()


def ok(body: bytes, *, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))


async def keep_alive_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          server: Server) -> None:
    while (request := await server.read_request(reader)) is not None:
        body = request.partition(b"\r\n\r\n")[2]
        writer.write(ok(b'{"echo": %d}' % len(body)))
        await writer.drain()


async def exchange(pool: Pool, body: bytes = b"{}", headers: dict[str, str] | None = None,
                   path: str = "/v1/completions") -> tuple[int, dict[str, str], bytes]:
    head = pool.head(path, len(body), headers or {"Content-Type": "application/json"})
    response = await pool.send(head, body)
    await response.wait_head()
    data = await response.read()
    return response.status, response.headers, data


async def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request() -> None:
    async with running(keep_alive_echo) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}/base/", 8, 1.0)
        for size in (2, 5000, 70000):  # the last one is written apart from its head
            status, headers, data = await exchange(pool, b"x" * size,
                                                   {"X-Request-Id": "abc", "Accept": "*/*"})
            assert (status, data) == (200, b'{"echo": %d}' % size)
            assert headers["content-type"] == "application/json; charset=utf-8"
        pool.close()
    assert server.num_connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{server.port}\r\n".encode() in first
    assert b"\r\nX-Request-Id: abc\r\n" in first and b"\r\nContent-Length: 2\r\n" in first


async def test_pool_bounds_open_connections_and_queues_the_rest() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   server: Server) -> None:
        while await server.read_request(reader) is not None:
            await asyncio.sleep(0.02)
            writer.write(ok(b"{}"))
            await writer.drain()

    async with running(slow) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 2, 1.0)
        assert not pool.is_full
        exchanges = asyncio.gather(*(exchange(pool) for _ in range(8)))
        await asyncio.sleep(0.01)
        assert pool.is_full  # both connections busy, six requests waiting
        results = await exchanges
        assert not pool.is_full
        pool.close()
    assert [status for status, _, _ in results] == [200] * 8
    assert server.max_open == 2
    assert server.num_connections == 2


async def test_waiters_get_slots_in_order_and_a_cancelled_one_loses_none() -> None:
    async with running(keep_alive_echo) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 1, 1.0)
        held = await pool.acquire()  # the only slot
        order: list[str] = []

        async def take(name: str) -> None:
            conn = await pool.acquire()
            order.append(name)
            pool.release(conn)

        first = asyncio.create_task(take("first"))
        gone = asyncio.create_task(take("gone"))
        last = asyncio.create_task(take("last"))
        await asyncio.sleep(0)
        gone.cancel()  # cancelled while it waits: it never held a slot
        await asyncio.sleep(0)
        pool.release(held)
        await asyncio.wait_for(asyncio.gather(first, last), 2.0)
        assert order == ["first", "last"]
        assert not pool.is_full

        # Handed the slot, then cancelled before it ran: the slot passes to the next waiter.
        held = await pool.acquire()
        handed = asyncio.create_task(pool.acquire())
        after = asyncio.create_task(take("after"))
        await asyncio.sleep(0)
        pool.release(held)  # hands the slot to ``handed``
        handed.cancel()
        await asyncio.wait_for(after, 2.0)
        assert handed.cancelled() and order[-1] == "after" and not pool.is_full
        pool.close()


async def test_chunked_stream_arrives_as_it_is_sent() -> None:
    release = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        writer.write(b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await server.read_request(reader)  # keep the connection open

    async with running(chunked) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 4, 1.0)
        response = await pool.send(pool.head("/x", 0, {}), b"")
        await response.wait_head()
        assert (response.status, response.content_type) == (200, "text/event-stream")
        assert await response.readany() == b"data: 1\n\n"  # before the server sent the rest
        assert not response.is_complete
        release.set()
        assert await response.readany() == b"data: 2\n\n"
        assert await response.readany() == b""
        assert response.is_eof()
        pool.close()


async def test_close_before_the_end_hangs_up_and_frees_the_slot() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # until the client hangs up (bounded by the test's timeout)
            writer.write(b"2\r\nab\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)

    async with running(endless) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 1, 1.0)
        response = await pool.send(pool.head("/x", 0, {}), b"")
        await response.wait_head()
        assert await response.readany()
        response.close()
        for _ in range(200):
            if server.disconnects:
                break
            await asyncio.sleep(0.01)
        assert server.disconnects == 1
        # The only slot is free again: a second request opens a new connection.
        second = await pool.send(pool.head("/x", 0, {}), b"")
        await second.wait_head()
        assert server.num_connections == 2
        second.close()
        pool.close()


BIG_PAYLOAD = bytes(range(256)) * 8192  # 2 MiB


async def answer_big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     server: Server) -> None:
    """Answers one request with BIG_PAYLOAD, written at once, then keeps the connection."""
    await server.read_request(reader)
    writer.write(ok(BIG_PAYLOAD))
    await writer.drain()
    await server.read_request(reader)


async def test_slow_reader_pauses_the_socket_and_loses_nothing() -> None:
    async with running(answer_big) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 1, 1.0)
        response = await pool.send(pool.head("/x", 0, {}), b"")
        await response.wait_head()
        await asyncio.sleep(0.1)  # let the socket fill the buffer up to its bound
        assert response._size <= http1.HIGH_WATER_BYTES + 256 * 1024
        parts = []
        while chunk := await response.readany():
            parts.append(chunk)
            await asyncio.sleep(0)
        assert b"".join(parts) == BIG_PAYLOAD
        pool.close()


async def test_splice_hands_chunks_over_in_order_and_pauses_on_request() -> None:
    async with running(answer_big) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 1, 1.0)
        response = await pool.send(pool.head("/x", 0, {}), b"")
        await response.wait_head()
        await asyncio.sleep(0.05)  # some of the body arrives before the splice: it goes first
        assert response._chunks
        parts: list[bytes] = []

        def sink(chunk: bytes) -> bool:
            parts.append(chunk)
            return sum(map(len, parts)) % (512 * 1024) < len(chunk)  # pause every ~512 KiB

        response.splice(sink)
        num_pauses = 0
        while not response.is_complete:
            await response.wait_spliced()
            if response.is_paused:
                num_pauses += 1
                before = len(parts)
                await asyncio.sleep(0.02)
                assert len(parts) == before  # paused: nothing more is handed over
                response.resume_reading()
        assert b"".join(parts) == BIG_PAYLOAD
        assert num_pauses >= 2
        assert await response.readany() == b""
        pool.close()


async def test_connection_close_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   server: Server) -> None:
        await server.read_request(reader)
        writer.write(ok(b"{}", extra=b"Connection: close\r\n"))
        await writer.drain()

    async with running(once) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 4, 1.0)
        for _ in range(3):
            assert (await exchange(pool))[0] == 200
        pool.close()
    assert server.num_connections == 3


async def test_a_body_ended_by_closing_the_connection_is_complete() -> None:
    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        writer.write(b"data: 1\n\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    async with running(http10) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 4, 1.0)
        status, _, data = await exchange(pool)
        assert (status, data) == (200, b"data: 1\n\ndata: [DONE]\n\n")
        assert (await exchange(pool))[2] == b"data: 1\n\ndata: [DONE]\n\n"
        pool.close()
    assert server.num_connections == 2  # such a connection cannot be reused


@pytest.mark.parametrize("reply", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the server hangs up
    b"",  # hangs up without a byte
])
async def test_broken_answers_raise_upstream_broken(reply: bytes) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     server: Server) -> None:
        await server.read_request(reader)
        writer.write(reply)
        await writer.drain()

    async with running(broken) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 4, 1.0)
        with pytest.raises(UpstreamBroken):
            await exchange(pool)
        # The broken connection is gone; the pool still works for the next request.
        assert pool.num_open == 0
        pool.close()


async def test_a_dropped_request_is_not_sent_again_and_idle_connections_expire(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that drops a request on a kept-alive connection may have been working on it:
    the client reports it and does not send it twice. A connection idle for IDLE_EXPIRY_S is
    closed instead of reused (engines close theirs after a few seconds)."""
    async def first_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         server: Server) -> None:
        await server.read_request(reader)
        writer.write(ok(b"{}"))
        await writer.drain()
        await server.read_request(reader)  # the second request on this connection: dropped

    async with running(first_only) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", 4, 1.0)
        assert (await exchange(pool))[0] == 200
        with pytest.raises(UpstreamBroken):
            await exchange(pool)
        assert len(server.requests) == 2
        assert server.num_connections == 1
        monkeypatch.setattr(http1, "IDLE_EXPIRY_S", 0.05)
        assert (await exchange(pool))[0] == 200  # a new connection
        await asyncio.sleep(0.1)
        assert (await exchange(pool))[0] == 200  # the idle one expired: another new one
        assert server.num_connections == 3
        assert len(server.requests) == 4
        pool.close()


async def test_refused_connection_raises_and_frees_its_slot() -> None:
    async with running(keep_alive_echo) as server:
        port = server.port
    pool = Pool(f"http://127.0.0.1:{port}", 1, 1.0)  # nothing listens there any more
    for _ in range(3):  # the one slot is given back each time
        with pytest.raises(OSError):
            await asyncio.wait_for(exchange(pool), 2.0)
    assert pool.num_open == 0


def test_header_line_breaks_are_refused_and_bad_urls_named() -> None:
    pool = Pool("http://127.0.0.1:1", 1, 1.0)
    with pytest.raises(ValueError, match="line break"):
        pool.head("/x", 0, {"X-Request-Id": "a\r\nX-Evil: 1"})
    with pytest.raises(ValueError, match="not an http"):
        Pool("ftp://example.test", 1, 1.0)


@dataclass
class _Timeouts:
    connect_timeout_s: float = 1.0
    first_byte_timeout_s: float = 0.6
    request_timeout_s: float = 0.2
    idle_timeout_s: float = 1.0
    max_connections_per_backend: int = 1


async def test_upstream_client_names_each_failure() -> None:
    """A busy pool, an engine that never answers and a refused connection are three
    different failures; only the last one says the backend is down."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     server: Server) -> None:
        await server.read_request(reader)
        await asyncio.sleep(1.0)  # answers nothing within the client's timeouts

    async with running(silent) as server:
        client = UpstreamClient(_Timeouts())
        await client.start()
        backend = Backend(name="b", url=f"http://127.0.0.1:{server.port}",
                          models=frozenset({"m"}))
        # A stream (0.6 s to its first byte) holds the only connection for longer than the
        # second request (0.2 s in all) may wait.
        first = asyncio.create_task(client.open(backend, "/x", b"{}", {}, is_stream=True))
        await asyncio.sleep(0.05)
        with pytest.raises(UpstreamFailure) as busy:
            await client.open(backend, "/x", b"{}", {}, is_stream=False)
        assert (busy.value.reason, busy.value.is_timeout) == ("pool_timeout", True)
        with pytest.raises(UpstreamFailure) as silence:
            await first
        assert (silence.value.reason, silence.value.is_timeout) == ("timeout", True)
        await client.close()
        port = server.port
    client = UpstreamClient(_Timeouts())
    await client.start()
    gone = Backend(name="gone", url=f"http://127.0.0.1:{port}", models=frozenset({"m"}))
    with pytest.raises(UpstreamFailure) as refused:
        await client.open(gone, "/x", b"{}", {}, is_stream=False)
    assert refused.value.reason == "connect" and "cannot connect" in str(refused.value)
    await client.close()
