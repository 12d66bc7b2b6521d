"""A plain Redis connection for a hot loop: one socket, RESP written by hand, hiredis parsing.

redis-py spends a few hundred µs of client CPU on each command on a small machine (a
connection taken from its pool and put back, retry and timeout wrappers, a response-parsing
coroutine, reply callbacks). The replicas' shared stream (``backends.fleet.approx_sync``) pays
that on every entry: each replica's writer sends every change within a round trip, and every
replica's reader wakes on every entry any of them adds, so with N replicas a request's changes
cost N + 1 commands each. Here a command is a few bytes in one write and a future that the
protocol's ``data_received`` answers, in order.

It stands in for plain clients only: ``RespAddress.of`` gives the address of a
``redis.asyncio.Redis`` on TCP or a Unix socket without TLS or a credential provider, and None
for anything else (Sentinel, Cluster, TLS), which keeps redis-py. Replies come as RESP2 gives
them (bytes, ints, lists; None for a null), as ``decode_responses=False`` would.

Failures raise redis-py's exceptions, so a caller's ``except REDIS_ERRORS`` holds: a lost or
refused connection fails every unanswered call with ``ConnectionError`` (the next call connects
again); a call not answered within its ``timeout_s`` raises ``TimeoutError`` and closes the
connection, whose replies could no longer be matched to their calls; an error reply raises
``ResponseError`` to its caller alone, and the connection stays up.

Example::

    address = RespAddress.of(redis_client)          # None: use redis_client itself
    conn = RespConnection(address, timeout_s=2.0)
    entries = await conn.xread({"s": "$"}, count=100, block_ms=100)  # waits 100 ms + 2 s
    ids = await conn.pipeline([("XADD", "s", "*", "f", "v")] * 3)
    await conn.aclose()
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RespAddress", "RespConnection", "pack_command", "stream_entries"]

Arg = str | int | float | bytes
RESP_TIMEOUT_S = 2.0  # a hot loop's wait for an answer (beyond a blocking read's own block)


@dataclass(frozen=True, slots=True)
class RespAddress:
    """Where and as whom to connect: a TCP host and port, or a Unix socket path."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def of(cls, client: object) -> RespAddress | None:
        """The address of a plain ``redis.asyncio.Redis``; None for any other client."""
        if not isinstance(client, aioredis.Redis):
            return None
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        if (pool.connection_class not in (Connection, UnixDomainSocketConnection)
                or kwargs.get("credential_provider") is not None):
            return None
        return cls(host=str(kwargs.get("host", "127.0.0.1")), port=int(kwargs.get("port", 6379)),
                   path=kwargs.get("path"), db=int(kwargs.get("db") or 0),
                   username=kwargs.get("username"), password=kwargs.get("password"))


def pack_command(parts: Sequence[Arg]) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes):
            data = part
        elif isinstance(part, str):
            data = part.encode()
        else:
            data = repr(part).encode() if isinstance(part, float) else b"%d" % part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def stream_entries(reply: Any) -> list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]:
    """An ``XREAD`` reply as RESP2 sends it (a null, or [[stream, [[id, [field, value, ...]],
    ...]], ...]) in redis-py's shape: [(stream, [(id, {field: value}), ...]), ...]. An entry
    without fields (deleted since) is left out."""
    if not reply:
        return []
    return [(stream, [(entry_id, dict(zip(flat[::2], flat[1::2], strict=False)))
                      for entry_id, flat in entries if flat])
            for stream, entries in reply]


class RespConnection:
    """One connection, opened on first use and again after a failure; calls answered in
    order. ``timeout_s`` bounds connecting and, unless a call gives its own, each call."""

    def __init__(self, address: RespAddress, *, timeout_s: float) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._transport: asyncio.Transport | None = None
        self._reader: Any = None
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._connecting: asyncio.Future[None] | None = None
        self.num_connects = 0

    @property
    def is_connected(self) -> bool:
        return self._transport is not None

    async def call(self, command: Sequence[Arg], *, timeout_s: float | None = None) -> Any:
        """One command's reply."""
        (reply,) = await self.pipeline([command], timeout_s=timeout_s)
        return reply

    async def xread(self, streams: Mapping[Arg, Arg], *, count: int, block_ms: int
                    ) -> list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]:
        """A blocking ``XREAD`` of ``streams`` (stream -> the id to read after), in redis-py's
        shape (``stream_entries``); its answer may take its block and ``timeout_s`` more."""
        reply = await self.call(("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS",
                                 *streams, *streams.values()),
                                timeout_s=block_ms / 1000 + self._timeout_s)
        return stream_entries(reply)

    async def pipeline(self, commands: Sequence[Sequence[Arg]], *,
                       timeout_s: float | None = None) -> list[Any]:
        """Every command in one write; their replies, in order. An error reply raises its
        ``ResponseError`` once every reply is in."""
        if not commands:
            return []
        transport = await self._connected()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._waiting.extend(futures)
        transport.write(b"".join(pack_command(command) for command in commands))
        try:
            async with asyncio.timeout(self._timeout_s if timeout_s is None else timeout_s):
                replies = [await future for future in futures]
        except TimeoutError:
            self._drop(RedisTimeoutError("Redis did not answer in time"))
            raise RedisTimeoutError("Redis did not answer in time") from None
        except asyncio.CancelledError:
            # The replies will still come, in order: matched to futures nobody awaits.
            self._drop(RedisConnectionError("a call was cancelled"))
            raise
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def transaction(self, commands: Sequence[Sequence[Arg]], *,
                          timeout_s: float | None = None) -> list[Any]:
        """``MULTI``, the commands, ``EXEC``, in one write: their replies, in order. A client
        blocked on a key they change is answered once, after all of them (in a plain pipeline
        Redis answers it after the first, and it must ask again for the rest). A command's
        error reply raises its ``ResponseError`` (the others ran: ``EXEC`` does not roll back).
        One command is sent alone: it is answered, and answers blocked clients, as one anyway."""
        if len(commands) < 2:
            return await self.pipeline(commands, timeout_s=timeout_s)
        replies = await self.pipeline([("MULTI",), *commands, ("EXEC",)], timeout_s=timeout_s)
        results = replies[-1]
        if not isinstance(results, list):
            raise ResponseError(f"EXEC answered {results!r}")
        for result in results:
            if isinstance(result, ResponseError):
                raise result
        return results

    async def aclose(self) -> None:
        self._drop(RedisConnectionError("the connection was closed"))

    async def _connected(self) -> asyncio.Transport:
        while self._transport is None:
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            await asyncio.shield(self._connecting)
        return self._transport

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        address = self._address
        try:
            async with asyncio.timeout(self._timeout_s):
                if address.path is not None:
                    transport, _ = await loop.create_unix_connection(
                        lambda: _Protocol(self), address.path)
                else:
                    transport, _ = await loop.create_connection(
                        lambda: _Protocol(self), address.host, address.port)
                # uvloop's transports are not asyncio.Transport subclasses, but act as one.
                self._reader = hiredis.Reader(replyError=ResponseError)
                self._transport = transport
                self.num_connects += 1
                await self._handshake()
        except (OSError, TimeoutError, RedisConnectionError, ResponseError) as exc:
            error = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            self._drop(RedisConnectionError(f"cannot reach Redis: {error}"))
            raise RedisConnectionError(f"cannot reach Redis: {error}") from None
        finally:
            self._connecting = None

    async def _handshake(self) -> None:
        """AUTH and SELECT where the address asks for them."""
        address = self._address
        commands: list[tuple[Arg, ...]] = []
        if address.password is not None:
            commands.append(("AUTH", address.password) if address.username is None
                            else ("AUTH", address.username, address.password))
        if address.db:
            commands.append(("SELECT", address.db))
        if not commands:
            return
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._waiting.extend(futures)
        assert self._transport is not None
        self._transport.write(b"".join(pack_command(command) for command in commands))
        for future in futures:
            reply = await future
            if isinstance(reply, ResponseError):
                raise reply

    def _on_data(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        while (reply := reader.gets()) is not False:
            if not waiting:  # a reply to nothing: the stream can no longer be trusted
                self._drop(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            future = waiting.popleft()
            if not future.done():
                future.set_result(reply)

    def _drop(self, error: Exception) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        waiting, self._waiting = self._waiting, deque()
        for future in waiting:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a call that gave up on it is not warned of

    def _on_lost(self, transport: asyncio.BaseTransport, exc: BaseException | None) -> None:
        if transport is self._transport:
            self._drop(RedisConnectionError(f"lost the connection to Redis: {exc}" if exc
                                            else "Redis closed the connection"))


class _Protocol(asyncio.Protocol):
    __slots__ = ("_conn", "_transport")

    def __init__(self, conn: RespConnection) -> None:
        self._conn = conn
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._transport is self._conn._transport:
            self._conn._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._conn._on_lost(self._transport, exc)
