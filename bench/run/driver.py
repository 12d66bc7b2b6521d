"""The send loop: open-loop arrivals or a closed loop of fixed concurrency, with hard bounds.

Open loop: each request leaves at its scheduled arrival, however slow earlier ones are, and
``lag_s`` records how late it left. Closed loop: ``concurrency`` senders, each sending its next
request as soon as its last one finished. Either way no request is sent after
``send_window_s``, at most ``max_requests`` are sent, and at ``deadline_s`` everything still in
flight is cancelled and recorded as cut off (status -1). Turn ``n`` of a conversation waits
for turn ``n - 1`` to finish and carries its real answer. Example::

    driver = Driver(client, DriveLimits(mode="open", concurrency=None, max_requests=1000,
                                        send_window_s=25, deadline_s=30))
    records = await driver.run(schedule)   # schedule: (at_s, phase, spec) in time order
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from bench.run.client import Client
from bench.run.spec import Message, Record, RequestSpec

Mode = Literal["open", "closed"]
Scheduled = tuple[float, int, RequestSpec]  # arrival offset (s), phase, request
CUT_OFF = "cut off at the end of the run (--duration)"


@dataclass(frozen=True, slots=True)
class DriveLimits:
    """How a run sends and when it must stop."""

    mode: Mode
    concurrency: int | None  # closed loop: requests in flight
    max_requests: int
    send_window_s: float
    deadline_s: float


class Driver:
    """Runs a schedule through a `Client`; its counters feed the progress bar."""

    def __init__(self, client: Client, limits: DriveLimits) -> None:
        self._client = client
        self._limits = limits
        self.records: list[Record] = []
        self.num_done = 0
        self.num_failed = 0
        self.started_at = time.perf_counter()
        self._finished: dict[tuple[int, int], asyncio.Event] = {}
        self._sent: dict[int, tuple[tuple[Message, ...], str]] = {}  # conversation: last turn
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def num_sent(self) -> int:
        """Requests sent so far (each has a record)."""
        return len(self.records)

    def elapsed_s(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.started_at

    async def run(self, schedule: Iterator[Scheduled]) -> list[Record]:
        """Send the schedule; returns one record per request sent, in sending order."""
        self.started_at = time.perf_counter()
        loop = self._open_loop(schedule) if self._limits.mode == "open" \
            else self._closed_loop(schedule)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._limits.deadline_s):
                await loop
                if self._tasks:
                    await asyncio.gather(*self._tasks)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return self.records

    async def _open_loop(self, schedule: Iterator[Scheduled]) -> None:
        for at_s, phase, spec in schedule:
            if self.num_sent >= self._limits.max_requests or at_s >= self._limits.send_window_s:
                return
            delay_s = at_s - self.elapsed_s()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            record = self._new_record(spec, phase, lag_s=max(0.0, -delay_s))
            task = asyncio.create_task(self._send(spec, record))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _closed_loop(self, schedule: Iterator[Scheduled]) -> None:
        async def sender() -> None:
            while (self.num_sent < self._limits.max_requests
                   and self.elapsed_s() < self._limits.send_window_s):
                scheduled = next(schedule, None)
                if scheduled is None:
                    return
                _, phase, spec = scheduled
                await self._send(spec, self._new_record(spec, phase, lag_s=0.0))

        await asyncio.gather(*(sender() for _ in range(self._limits.concurrency or 1)))

    def _new_record(self, spec: RequestSpec, phase: int, lag_s: float) -> Record:
        record = Record(index=spec.index, tenant=spec.tenant.name, tier=spec.tenant.tier,
                        phase=phase, is_stream=spec.is_stream, sent_at_s=self.elapsed_s(),
                        lag_s=lag_s, conversation=spec.conversation, turn=spec.turn,
                        group=spec.group)
        self.records.append(record)
        if spec.conversation is not None:
            self._finished[(spec.conversation, spec.turn)] = asyncio.Event()
        return record

    async def _send(self, spec: RequestSpec, record: Record) -> None:
        messages = spec.messages
        try:
            if spec.conversation is not None and spec.turn > 0:
                waited_from = time.perf_counter()
                previous = self._finished.get((spec.conversation, spec.turn - 1))
                if previous is not None:
                    await previous.wait()
                record.lag_s += time.perf_counter() - waited_from
                messages = self._with_real_history(spec)
            await self._client.send(spec, record, messages, self.started_at)
        except asyncio.CancelledError:
            record.status, record.error = -1, CUT_OFF
            raise
        finally:
            self.num_done += 1
            self.num_failed += not record.is_ok
            if spec.conversation is not None:
                self._sent[spec.conversation] = (messages, record.answer)
                self._finished.pop((spec.conversation, spec.turn - 1), None)
                self._finished[(spec.conversation, spec.turn)].set()

    def _with_real_history(self, spec: RequestSpec) -> tuple[Message, ...]:
        """What the previous turn really sent and got back, then this turn's question; the
        spec's placeholder answer stands in where the engine gave none."""
        last = self._sent.get(spec.conversation) if spec.conversation is not None else None
        if last is None:
            return spec.messages
        sent, answer = last
        placeholder = spec.messages[-2]
        reply = {**placeholder, "content": answer} if answer else placeholder
        return (*sent, reply, spec.messages[-1])
