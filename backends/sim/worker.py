"""The async shell around ``SimEngineCore``: real time, requests in, tokens out, KV events.

One ``SimWorker`` is one simulated GPU. Its loop sleeps each step's modelled time against
absolute deadlines (so errors do not accumulate), then hands every sequence its new token.
Many workers share one event loop (``switchyard sim --workers 32``).

Example::

    worker = SimWorker("sim-0", WorkerProfile(model="m"))
    task = asyncio.create_task(worker.run())
    handle = worker.submit("req-1", prompt_ids, max_tokens=16)
    async for token in handle.tokens():
        ...
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from backends.engine_core.sequence import Sequence
from backends.engine_core.types import EnginePhases
from backends.publisher import KvPublisher
from backends.sim.core import SimEngineCore
from backends.sim.profile import WorkerProfile

# Behind its deadlines, a worker runs up to this many steps before it yields the loop.
MAX_OVERDUE_STEPS_PER_YIELD = 8


@dataclass(frozen=True, slots=True)
class TokenEvent:
    num_output_tokens: int
    finish_reason: str | None


class RequestHandle:
    """A submitted request: its token events as they are generated, and its timings.

    One consumer reads the events, with ``next_events()`` or ``tokens()``. Tokens wait in a
    list and a single future wakes the consumer: this is paid per token per stream, so it
    stays lighter than an ``asyncio.Queue``.
    """

    __slots__ = ("_events", "_waiter", "arrival_s", "finish_reason", "finish_s",
                 "first_token_s", "num_cached_tokens", "num_output_tokens", "num_prompt_tokens",
                 "seq", "seq_id")

    def __init__(self, seq: Sequence, arrival_s: float) -> None:
        self.seq = seq
        self.seq_id = seq.seq_id
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.arrival_s = arrival_s
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self._events: list[TokenEvent] = []
        self._waiter: asyncio.Future[None] | None = None

    def _deliver(self, event: TokenEvent) -> None:
        self._events.append(event)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_events(self) -> list[TokenEvent]:
        """The token events delivered since the last call, waiting for at least one. A
        consumer that fell behind gets them all at once, so it can send them in one write."""
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        events, self._events = self._events, []
        return events

    async def tokens(self) -> AsyncIterator[TokenEvent]:
        """Each new token as it is generated; the last carries ``finish_reason``."""
        while True:
            for event in await self.next_events():
                yield event
                if event.finish_reason is not None:
                    return

    def phases(self) -> EnginePhases:
        seq = self.seq
        return EnginePhases(
            arrival_s=self.arrival_s, scheduled_s=seq.first_scheduled_time_s,
            first_token_s=self.first_token_s, finish_s=self.finish_s,
            num_prompt_tokens=self.num_prompt_tokens, num_cached_tokens=self.num_cached_tokens,
            num_output_tokens=self.num_output_tokens, num_preemptions=seq.num_preemptions,
        )

    async def wait_finished(self) -> None:
        while True:
            events = await self.next_events()
            if events[-1].finish_reason is not None:
                return


class SimWorker:
    """One simulated engine worker on the running event loop."""

    def __init__(
        self,
        worker_id: str,
        profile: WorkerProfile,
        *,
        publisher: KvPublisher | None = None,
        jitter_frac: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.profile = profile
        self.core = SimEngineCore(profile)
        self.publisher = publisher
        self._handles: dict[str, RequestHandle] = {}
        self._wakeup = asyncio.Event()
        self._idle_until_s = 0.0  # when the request that ended the latest idle spell arrived
        self._jitter_frac = jitter_frac
        self._rng = random.Random(seed)
        self.num_steps = 0
        self.total_lateness_s = 0.0  # how far real wake-ups trailed the modelled deadlines
        self.max_lateness_s = 0.0  # the worst of them
        self.num_requests_finished: dict[str, int] = {}
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        # GETs of /metrics and /health served: what the gateways' scrapes and probes cost it.
        self.num_pages_served = {"/metrics": 0, "/health": 0}

    def submit(
        self, seq_id: str, prompt_ids: list[int], max_tokens: int, cache_salt: str | None = None
    ) -> RequestHandle:
        """Queue a request; ValueError (with the reason) if this engine can never serve it."""
        now_s = asyncio.get_running_loop().time()
        seq = self.core.add_request(seq_id, prompt_ids, max_tokens, now_s, cache_salt=cache_salt)
        handle = RequestHandle(seq, now_s)
        self._handles[seq_id] = handle
        self.num_prompt_tokens_total += seq.num_prompt_tokens
        if not self._wakeup.is_set():
            self._idle_until_s = now_s
            self._wakeup.set()
        return handle

    def abort(self, seq_id: str) -> None:
        """The client went away: free the sequence's slot and KV at once."""
        if self._handles.pop(seq_id, None) is not None:
            self.core.abort(seq_id)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline_s = loop.time()
        num_overdue_steps = 0  # run since this loop last let its clients have the loop
        while True:
            if not self.core.has_work:
                self._wakeup.clear()
                self._publish_kv_events()
                await self._wakeup.wait()
                # The engine starts when the request arrives, not when this task gets the
                # loop: a busy loop would otherwise delay every later step of this worker.
                deadline_s = self._idle_until_s
                continue
            _, step_s = self.core.step(deadline_s)
            if self._jitter_frac:
                step_s *= max(0.0, 1.0 + self._rng.gauss(0.0, self._jitter_frac))
            deadline_s += step_s
            delay_s = deadline_s - loop.time()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
                delay_s = deadline_s - loop.time()  # a busy loop wakes us late, too
                num_overdue_steps = 0
            elif num_overdue_steps >= MAX_OVERDUE_STEPS_PER_YIELD:
                await asyncio.sleep(0)  # let clients run even when the fleet is behind
                num_overdue_steps = 0
            else:
                # Behind: catch up on a few steps first, so each stream sends their tokens
                # in one write. A write per token costs the loop as much when catching up as
                # when keeping pace, so a loaded fleet that fell behind once stayed behind.
                num_overdue_steps += 1
            if delay_s < 0:
                self.total_lateness_s -= delay_s
                self.max_lateness_s = max(self.max_lateness_s, -delay_s)
            outcome = self.core.finish_step(deadline_s)
            self.num_steps += 1
            for token in outcome.tokens:
                handle = self._handles.get(token.seq_id)
                if handle is None:
                    continue
                if token.is_first:
                    handle.first_token_s = deadline_s
                    handle.num_cached_tokens = handle.seq.num_cached_tokens
                handle.num_output_tokens = token.num_output_tokens
                self.num_generation_tokens_total += 1
                if token.finish_reason is not None:
                    handle.finish_reason = token.finish_reason
                    handle.finish_s = deadline_s
                    del self._handles[token.seq_id]
                    finished = self.num_requests_finished
                    finished[token.finish_reason] = finished.get(token.finish_reason, 0) + 1
                handle._deliver(TokenEvent(token.num_output_tokens, token.finish_reason))
            self._publish_kv_events()

    def _publish_kv_events(self) -> None:
        events = self.core.drain_kv_events()
        if self.publisher is None:
            return
        for event in events:
            self.publisher.record(event.kind, list(event.block_hashes))  # type: ignore[arg-type]

    def resident_hashes(self) -> list[int]:
        return self.core.block_manager.resident_hashes()

    def load(self) -> dict[str, float | int]:
        load = self.core.load()
        return {
            "num_running": load.num_running,
            "num_waiting": load.num_waiting,
            "kv_usage": round(load.kv_usage, 4),
            "num_free_kv_blocks": load.num_free_kv_blocks,
            "num_prefix_kv_blocks": load.num_prefix_kv_blocks,
            "num_queued_prefill_tokens": load.num_queued_prefill_tokens,
            "num_preemptions": load.num_preemptions,
        }
