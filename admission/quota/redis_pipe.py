"""The quota scripts' own Redis connection: one pipelined socket, RESP written by hand, hiredis
parsing the replies, no task per call.

redis-py spends ~75 µs of client CPU on a lone ``EVALSHA`` (a connection taken from its pool and
put back, retry and timeout wrappers, command packing, a response-parsing coroutine); the quota
store makes one or two script calls per request. Here a call is a future and a few bytes
appended to one write; the protocol's ``data_received`` hands each reply to its call's future,
in order. The scheduling is that of ``ScriptBatcher`` (admission/quota/redis_batch.py), which stays
for clients this connection cannot stand in for (``RedisCluster``, TLS, credential providers):

- the calls made in one loop iteration leave as one write (one round trip) from a ``call_soon``
  callback, at most ``max_batch_size`` per write and ``max_in_flight`` writes unanswered; a
  call made while nothing is queued or unanswered is written at once; in a write, an ops
  script's calls with the same keys are one command (``pipe.merge_calls``);
- a deferrable call (a settle) rides with the next write, or leaves after its delay;
- ``NOSCRIPT`` (after ``SCRIPT FLUSH`` or a Redis restart) is answered by sending that call
  again with ``EVAL``, counted in ``num_script_loads``; any other error reply goes to its caller.

Every call is answered within ``timeout_s`` of being queued or written (plus the delay of a
deferred one): a watchdog fails the calls past their time with ``TimeoutError``, and closes the
connection when an unanswered write is (its replies' order can no longer be trusted). A lost
connection fails every unanswered call with ``ConnectionError`` at once; the next call connects
again. A caller that is cancelled only loses its reply: its command may already be in Redis.

Example::

    pipe = RespScriptPipe(RespAddress.of(redis_client), timeout_s=0.25)
    reply = await pipe.run(OPS_SCRIPT, keys, (ttl_ms, hint_ms, replica, "A", *acquire_args))
    settled = pipe.defer(OPS_SCRIPT, keys, (ttl_ms, hint_ms, replica, "S", *settle_args), 0.05)
    await pipe.aclose()
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from admission.quota.lua import LuaScript
from admission.quota.pipe import merge_calls, split_reply, unit_args
from backends.resp import RespAddress, pack_command

__all__ = ["RespAddress", "RespScriptPipe"]


class _Call:
    __slots__ = ("args", "at_s", "future", "keys", "script")

    def __init__(self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int],
                 future: asyncio.Future[Any], at_s: float) -> None:
        self.script, self.keys, self.args, self.future, self.at_s = (
            script, keys, args, future, at_s)


class _Write:
    """One write's commands, answered in order: each the calls it carries (merged, or one)."""

    __slots__ = ("num_answered", "sent_s", "units")

    def __init__(self, units: list[list[_Call]], sent_s: float) -> None:
        self.units, self.sent_s, self.num_answered = units, sent_s, 0

    def calls(self, start: int = 0) -> list[_Call]:
        return [queued for unit in self.units[start:] for queued in unit]


class RespScriptPipe:
    """Script calls over one pipelined connection; see the module docstring."""

    bounds_calls = True  # every call is answered within timeout_s: callers need no timer

    def __init__(self, address: RespAddress, *, timeout_s: float, max_batch_size: int = 256,
                 max_in_flight: int = 4, send_idle_calls_at_once: bool = True) -> None:
        if max_batch_size < 1 or max_in_flight < 1:
            raise ValueError("max_batch_size and max_in_flight must be at least 1")
        self._address = address
        self._timeout_s = timeout_s
        self._max_batch_size = max_batch_size
        self._max_in_flight = max_in_flight
        self._send_idle_calls_at_once = send_idle_calls_at_once
        self._transport: asyncio.Transport | None = None
        self._reader: Any = None
        self._connecting: asyncio.Task[None] | None = None
        self._pending: deque[_Call] = deque()  # queued, not written
        self._unanswered: deque[_Write] = deque()
        self._deferred: list[_Call] = []
        self._defer_timer: asyncio.TimerHandle | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.num_calls = 0
        self.num_round_trips = 0
        self.num_script_loads = 0

    def counters(self) -> dict[str, int]:
        return {"num_calls": self.num_calls, "num_round_trips": self.num_round_trips,
                "num_script_loads": self.num_script_loads}

    # -- calls ----------------------------------------------------------------------------
    async def run(self, script: LuaScript, keys: Sequence[str],
                  args: Sequence[str | int]) -> Any:
        """One script call's reply (or its error raised)."""
        return await self.call(script, keys, args)

    def call(self, script: LuaScript, keys: Sequence[str],
             args: Sequence[str | int]) -> asyncio.Future[Any]:
        """Queue one script call (or write it at once when the pipe is idle); never blocks."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        queued = _Call(script, keys, args, future, loop.time())
        self.num_calls += 1
        if (self._send_idle_calls_at_once and self._transport is not None
                and not self._unanswered and not self._pending):
            self._write([*self._take_deferred(), queued], loop)
        else:
            self._pending.append(queued)
            self._schedule_flush(loop)
        return future

    async def run_deferred(self, script: LuaScript, keys: Sequence[str],
                           args: Sequence[str | int], max_delay_s: float) -> Any:
        return await self.defer(script, keys, args, max_delay_s)

    def defer(self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int],
              max_delay_s: float) -> asyncio.Future[Any]:
        """A call that may wait up to ``max_delay_s``: it leaves with the next write."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._deferred.append(_Call(script, keys, args, future, 0.0))
        self.num_calls += 1
        if self._defer_timer is None:
            self._defer_timer = loop.call_later(max_delay_s, self._flush_deferred)
        return future

    async def aclose(self, flush_timeout_s: float = 1.0) -> None:
        """Send what is deferred or queued and wait up to ``flush_timeout_s`` for the answers
        (the last requests' settles reach Redis on shutdown, instead of holding their leases
        until the TTL), then fail what is left and close the connection."""
        if flush_timeout_s > 0 and (self._deferred or self._pending or self._unanswered):
            self._flush_deferred()
            waiting = [queued.future for queued in self._pending]
            waiting += [queued.future for write in self._unanswered for queued in write.calls()]
            if waiting:
                await asyncio.wait(waiting, timeout=flush_timeout_s)
        self._drop_connection(RedisConnectionError("quota script pipe closed"))
        _fail(self._pending, RedisConnectionError("quota script pipe closed"))
        self._pending.clear()
        _fail(self._take_deferred(), RedisConnectionError("quota script pipe closed"))
        if self._connecting is not None:
            self._connecting.cancel()

    # -- writing --------------------------------------------------------------------------
    def _take_deferred(self) -> list[_Call]:
        deferred, self._deferred = self._deferred, []
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        return [queued for queued in deferred if not queued.future.done()]

    def _flush_deferred(self) -> None:
        self._defer_timer = None
        if self._deferred:
            loop = asyncio.get_running_loop()
            now_s = loop.time()
            for queued in self._deferred:
                queued.at_s = now_s
            self._pending.extendleft(reversed(self._take_deferred()))
            self._schedule_flush(loop)

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs after every callback already due in this iteration: one write for all of them.
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        self._arm_watchdog(loop)

    def _flush(self) -> None:
        self._flush_handle = None
        loop = asyncio.get_running_loop()
        if self._transport is None:
            if self._pending and self._connecting is None:
                self._connecting = loop.create_task(self._connect())
            return
        while self._pending and len(self._unanswered) < self._max_in_flight:
            batch = self._take_deferred()
            while self._pending and len(batch) < self._max_batch_size:
                queued = self._pending.popleft()
                if not queued.future.done():  # its caller gave up: do not send it
                    batch.append(queued)
            if batch:
                self._write(batch, loop)

    def _write(self, batch: list[_Call], loop: asyncio.AbstractEventLoop) -> None:
        self._write_units(merge_calls(batch), loop, use_eval=False)

    def _write_units(self, units: list[list[_Call]], loop: asyncio.AbstractEventLoop,
                     use_eval: bool) -> None:
        assert self._transport is not None
        self._transport.write(b"".join([_pack(unit, use_eval) for unit in units]))
        self._unanswered.append(_Write(units, loop.time()))
        self.num_round_trips += 1
        self._arm_watchdog(loop)

    # -- replies --------------------------------------------------------------------------
    def _on_data(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        reload: list[list[_Call]] = []
        while (reply := reader.gets()) is not False:
            if not self._unanswered:  # a reply nobody asked for: the stream is out of step
                self._drop_connection(RedisConnectionError("unexpected reply from Redis"))
                return
            write = self._unanswered[0]
            unit = write.units[write.num_answered]
            write.num_answered += 1
            if write.num_answered == len(write.units):
                self._unanswered.popleft()
            if isinstance(reply, ResponseError):
                if str(reply).startswith("NOSCRIPT"):
                    reload.append(unit)
                else:
                    _answer_error(unit, str(reply))
                continue
            try:
                answers = split_reply(unit, reply)
            except ResponseError as exc:
                _answer_error(unit, str(exc))
                continue
            for queued, answer in zip(unit, answers, strict=True):
                if not queued.future.done():
                    queued.future.set_result(answer)
        loop = asyncio.get_running_loop()
        if reload and self._transport is not None:
            self.num_script_loads += len(reload)
            self._write_units(reload, loop, use_eval=True)
        if self._pending and len(self._unanswered) < self._max_in_flight:
            self._schedule_flush(loop)

    # -- the connection -------------------------------------------------------------------
    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        address = self._address
        protocol = _Protocol(self)
        try:
            async with asyncio.timeout(self._timeout_s):
                if address.path is not None:
                    transport, _ = await loop.create_unix_connection(lambda: protocol,
                                                                     address.path)
                else:
                    transport, _ = await loop.create_connection(lambda: protocol, address.host,
                                                                address.port)
                self._reader = hiredis.Reader(replyError=ResponseError)
                self._transport = transport
                await self._handshake(loop)
        except (OSError, TimeoutError, RedisConnectionError, ResponseError) as exc:
            error = (RedisTimeoutError("Redis did not answer the connection in time")
                     if isinstance(exc, TimeoutError) else exc)
            self._drop_connection(RedisConnectionError(f"cannot reach Redis: {error}"))
            _fail(self._pending, RedisConnectionError(f"cannot reach Redis: {error}"))
            self._pending.clear()
            return
        finally:
            self._connecting = None
        self._flush()

    async def _handshake(self, loop: asyncio.AbstractEventLoop) -> None:
        """AUTH and SELECT where the address asks for them."""
        commands: list[tuple[str | int, ...]] = []
        address = self._address
        if address.password is not None:
            commands.append(("AUTH", address.password) if address.username is None
                            else ("AUTH", address.username, address.password))
        if address.db:
            commands.append(("SELECT", address.db))
        if not commands:
            return
        futures = [loop.create_future() for _ in commands]
        assert self._transport is not None
        self._transport.write(b"".join(pack_command(command) for command in commands))
        self._unanswered.append(_Write([[_Call(_NO_SCRIPT, (), (), future, loop.time())]
                                        for future in futures], loop.time()))
        for reply in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(reply, BaseException):
                raise reply

    def _on_lost(self, exc: BaseException | None) -> None:
        self._drop_connection(RedisConnectionError(f"lost the connection to Redis: {exc}"
                                                   if exc else "Redis closed the connection"))
        if self._pending:  # connect again for them
            self._schedule_flush(asyncio.get_running_loop())

    def _drop_connection(self, error: Exception) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        unanswered = [queued for write in self._unanswered
                      for queued in write.calls(write.num_answered)]
        self._unanswered.clear()
        _fail(unanswered, error)

    def _arm_watchdog(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._watchdog is not None:
            return
        oldest_s = min(self._unanswered[0].sent_s if self._unanswered else float("inf"),
                       self._pending[0].at_s if self._pending else float("inf"))
        if oldest_s != float("inf"):
            self._watchdog = loop.call_at(oldest_s + self._timeout_s, self._on_watchdog)

    def _on_watchdog(self) -> None:
        self._watchdog = None
        loop = asyncio.get_running_loop()
        expired_s = loop.time() - self._timeout_s
        if self._unanswered and self._unanswered[0].sent_s <= expired_s:
            self._drop_connection(RedisTimeoutError(
                f"Redis did not answer within {self._timeout_s:g} s"))
        while self._pending and self._pending[0].at_s <= expired_s:
            queued = self._pending.popleft()
            _fail([queued], RedisTimeoutError(
                f"no Redis connection within {self._timeout_s:g} s"))
        if self._pending and self._transport is None and self._connecting is None:
            self._schedule_flush(loop)
        self._arm_watchdog(loop)


class _Protocol(asyncio.Protocol):
    __slots__ = ("_pipe", "_transport")

    def __init__(self, pipe: RespScriptPipe) -> None:
        self._pipe = pipe
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._pipe._transport is self._transport:  # a stale socket's bytes are dropped
            self._pipe._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._pipe._transport is self._transport:
            self._pipe._on_lost(exc)


_NO_SCRIPT = LuaScript("")


def _pack(unit: list[_Call], use_eval: bool) -> bytes:
    first = unit[0]
    script = first.script
    head = ("EVAL", script.text) if use_eval else ("EVALSHA", script.sha)
    return pack_command((*head, len(first.keys), *first.keys, *unit_args(unit)))


def _answer_error(unit: list[_Call], message: str) -> None:
    """An error reply to a command: each of its callers gets it (its own exception)."""
    for queued in unit:
        if not queued.future.done():
            queued.future.set_exception(ResponseError(message))


def _fail(calls: Sequence[_Call] | deque[_Call], exc: BaseException) -> None:
    for queued in calls:
        if not queued.future.done():
            queued.future.set_exception(exc)
            # Mark it retrieved: a caller that gave up in the same iteration never reads it.
            queued.future.exception()
