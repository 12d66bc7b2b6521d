"""Coalesce Lua script calls into one pipeline per event-loop iteration.

Every script call made while the loop runs one iteration (the acquires, settles and renews of
all concurrent requests, whatever their tenant) is queued. The first one starts a sender task;
a task first runs in the next iteration, after all of them, and then sends the queue as one
non-transactional pipeline: one write, one round trip, replies in order. Each caller awaits its
own future. Under load a pipelined ``EVALSHA`` costs the client well under half the CPU of one
sent on its own, and Redis reads and answers the batch in one go; a lone call is sent as a plain
command (a pipeline of one would only add work).

Errors stay per caller. A command's error (``NOSCRIPT``, a script error) comes back to its
caller only; the ``NOSCRIPT`` ones are sent again with ``EVAL`` (one more round trip, after a
``SCRIPT FLUSH`` or a Redis restart) and counted in ``num_script_loads``. A connection error or
a timeout of the pipeline fails every caller in it with that error. A caller that is cancelled
or gives up (its own timeout) before its batch is sent is left out of it; one that goes away
later only loses its reply; nobody else is affected.

Works with ``Redis`` and ``RedisCluster``: a cluster pipeline groups the commands by node (all
keys of one script call share one hash tag, so one slot) and sends one pipeline per node.

A call made while nothing else is queued or out (light load) is sent at once from its caller's
task (``run``): batching then costs a lone request nothing; the calls that arrive while it is
out are queued and leave together when it returns or the next iteration starts.

A call that may wait (``run_deferred``: a settle, which only releases a lease and moves a token
charge) is held until the next call is sent and rides in the same round trip, or leaves on its
own after ``max_delay_s``: under load each request then costs one round trip, its acquire.

Example::

    batcher = ScriptBatcher(redis, timeout_s=0.25)
    async with asyncio.timeout(0.25):
        reply = await batcher.run(OPS_SCRIPT, keys, (ttl_ms, hint_ms, replica, "A", *acquire_args))
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from admission.quota.lua import LuaScript
from admission.quota.pipe import merge_calls, split_reply, unit_args

__all__ = ["ScriptBatcher"]


@dataclass(slots=True)
class _Call:
    script: LuaScript
    keys: Sequence[str]
    args: Sequence[str | int]
    future: asyncio.Future[Any]


class ScriptBatcher:
    """Sends the script calls of one loop iteration as one pipeline; each caller gets its reply.

    At most ``max_batch_size`` calls go in one pipeline (more make several) and at most
    ``max_in_flight`` pipelines are outstanding; while they all are, new calls wait and go out
    together when one returns, so batches grow with the load instead of the number of
    connections. A pipeline is bounded by ``timeout_s``; callers bound their own wait.
    """

    bounds_calls = False  # a queued call can wait longer than timeout_s: callers add a timer

    def __init__(
        self,
        redis: aioredis.Redis | aioredis.RedisCluster,
        *,
        timeout_s: float,
        max_batch_size: int = 256,
        max_in_flight: int = 4,
        send_idle_calls_at_once: bool = True,
    ) -> None:
        if max_batch_size < 1 or max_in_flight < 1:
            raise ValueError("max_batch_size and max_in_flight must be at least 1")
        self._redis = redis
        self._timeout_s = timeout_s
        self._max_batch_size = max_batch_size
        self._max_in_flight = max_in_flight
        self._pending: deque[_Call] = deque()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._starting: asyncio.Task[None] | None = None
        self._num_inline = 0  # lone calls being sent from their callers' tasks (``run``)
        # Calls that may wait (``defer``): they ride with the next batch, or leave on a timer.
        self._deferred: list[_Call] = []
        self._defer_timer: asyncio.TimerHandle | None = None
        self._send_idle_calls_at_once = send_idle_calls_at_once
        self.num_calls = 0
        self.num_round_trips = 0
        self.num_script_loads = 0

    def counters(self) -> dict[str, int]:
        return {"num_calls": self.num_calls, "num_round_trips": self.num_round_trips,
                "num_script_loads": self.num_script_loads}

    async def run(self, script: LuaScript, keys: Sequence[str],
                  args: Sequence[str | int]) -> Any:
        """One script call's reply (or its error raised). When nothing else is queued or out,
        it is sent at once, from the caller's task: a lone request pays no extra loop hop.
        Calls made while it is out are queued and go together (``call``)."""
        if (not self._send_idle_calls_at_once or self._pending or self._in_flight
                or self._num_inline):
            return await self.call(script, keys, args)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.num_calls += 1
        self._num_inline += 1
        try:
            await self._send([*self._take_deferred(), _Call(script, keys, args, future)])
        finally:
            self._num_inline -= 1
            if self._pending:
                self._start_sender(asyncio.get_running_loop())
        return future.result()

    def call(self, script: LuaScript, keys: Sequence[str],
             args: Sequence[str | int]) -> asyncio.Future[Any]:
        """Queue one script call; the future holds its reply or its error. Never blocks."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append(_Call(script, keys, args, future))
        self.num_calls += 1
        self._start_sender(loop)
        return future

    async def run_deferred(self, script: LuaScript, keys: Sequence[str],
                           args: Sequence[str | int], max_delay_s: float) -> Any:
        """Like ``run``, for a call that may wait up to ``max_delay_s``: it goes with the next
        call that is sent (one round trip for both), or on its own when the delay is up."""
        return await self.defer(script, keys, args, max_delay_s)

    def defer(self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int],
              max_delay_s: float) -> asyncio.Future[Any]:
        """``run_deferred`` without waiting: the future holds the reply or the error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._deferred.append(_Call(script, keys, args, future))
        self.num_calls += 1
        if self._defer_timer is None:
            self._defer_timer = loop.call_later(max_delay_s, self._flush_deferred)
        return future

    async def aclose(self, flush_timeout_s: float = 1.0) -> None:
        """Send what is deferred or queued and wait up to ``flush_timeout_s`` for the answers
        (the last requests' settles reach Redis on shutdown, instead of holding their leases
        until the TTL), then fail what is left. The Redis client is the caller's to close."""
        if flush_timeout_s > 0 and (self._deferred or self._pending or self._in_flight):
            waiting: list[asyncio.Future[Any]] = [queued.future for queued in self._deferred]
            waiting += [queued.future for queued in self._pending]
            self._flush_deferred()
            waiting += list(self._in_flight)
            await asyncio.wait(waiting, timeout=flush_timeout_s)
        closed = RedisConnectionError("quota script batcher closed")
        _fail(self._pending, closed)
        self._pending.clear()
        _fail(self._take_deferred(), closed)

    def _take_deferred(self) -> list[_Call]:
        deferred, self._deferred = self._deferred, []
        if self._defer_timer is not None:
            self._defer_timer.cancel()
            self._defer_timer = None
        return [queued for queued in deferred if not queued.future.done()]

    def _flush_deferred(self) -> None:
        self._defer_timer = None
        if self._deferred:
            self._pending.extendleft(reversed(self._take_deferred()))
            self._start_sender(asyncio.get_running_loop())

    def _start_sender(self, loop: asyncio.AbstractEventLoop) -> None:
        # A new task first runs in the next loop iteration, after every call of this one: it
        # takes the queue then. One sender at a time waits to start, so one pipeline per tick.
        if (self._starting is not None
                or len(self._in_flight) + self._num_inline >= self._max_in_flight):
            return
        task = loop.create_task(self._send_next())
        self._starting = task
        self._in_flight.add(task)
        task.add_done_callback(self._on_sent)

    async def _send_next(self) -> None:
        self._starting = None
        batch: list[_Call] = self._take_deferred()  # first: a released lease lets an acquire in
        while self._pending and len(batch) < self._max_batch_size:
            queued = self._pending.popleft()
            if not queued.future.done():  # its caller gave up: do not send it
                batch.append(queued)
        if self._pending:  # over max_batch_size: the rest in another pipeline
            self._start_sender(asyncio.get_running_loop())
        if batch:
            await self._send(batch)

    def _on_sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        if self._starting is task:  # cancelled before it ran: only at shutdown
            self._starting = None
        if task.cancelled():
            _fail(self._pending, RedisConnectionError("quota script batcher cancelled"))
            self._pending.clear()
        elif self._pending:
            self._start_sender(asyncio.get_running_loop())

    async def _send(self, batch: list[_Call]) -> None:
        units = merge_calls(batch)  # an ops script's calls with the same keys: one command
        try:
            async with asyncio.timeout(self._timeout_s):
                replies = await self._execute(units, use_eval=False)
                missing = [i for i, reply in enumerate(replies)
                           if isinstance(reply, NoScriptError)]
                if missing:
                    self.num_script_loads += len(missing)
                    loaded = await self._execute([units[i] for i in missing], use_eval=True)
                    for i, reply in zip(missing, loaded, strict=True):
                        replies[i] = reply
        except asyncio.CancelledError:
            _fail(batch, RedisConnectionError("quota script batch cancelled"))
            raise
        except Exception as exc:  # the whole round trip failed: so did every call in it
            _fail(batch, exc)
            return
        for unit, reply in zip(units, replies, strict=True):
            if isinstance(reply, Exception):
                _fail(unit, reply)
                continue
            try:
                answers = split_reply(unit, reply)
            except ResponseError as exc:
                _fail(unit, exc)
                continue
            for queued, answer in zip(unit, answers, strict=True):
                if not queued.future.done():
                    queued.future.set_result(answer)

    async def _execute(self, units: list[list[_Call]], *, use_eval: bool) -> list[Any]:
        self.num_round_trips += 1
        if len(units) == 1:  # a lone command: a pipeline would only add client work
            try:
                return [await self._redis.execute_command(*_command(units[0], use_eval))]
            except ResponseError as exc:
                return [exc]
        pipe = self._redis.pipeline(transaction=False)
        for unit in units:
            pipe.execute_command(*_command(unit, use_eval))
        return list(await pipe.execute(raise_on_error=False))


def _command(unit: list[_Call], use_eval: bool) -> tuple[str | int, ...]:
    first = unit[0]
    keys, script = first.keys, first.script
    head = ("EVAL", script.text) if use_eval else ("EVALSHA", script.sha)
    return (*head, len(keys), *keys, *unit_args(unit))


def _fail(batch: Sequence[_Call], exc: BaseException) -> None:
    for queued in batch:
        if not queued.future.done():
            queued.future.set_exception(exc)
            # Mark it retrieved: a caller that timed out in the same iteration never reads it.
            queued.future.exception()
