"""`AsyncEngine`: the asyncio shell around `LLMEngine`, shaped like the simulator's `SimWorker`.

Steps run in one background thread (a single-worker executor), so the event loop, and the
aiohttp server on it, stays responsive while the model computes. Every touch of the engine
happens in that thread: `submit` validates at once (raising ValueError in the caller) and
queues the request; `abort` queues the abort; the thread applies both, in order, before its
next step. Outputs come back to the loop and are handed to each request's `RequestHandle`;
KV events go to the `KvPublisher`, as the simulated worker's do.

Example::

    engine = AsyncEngine(LLMEngine.from_path(device="cpu"), worker_id="worker-0")
    task = asyncio.create_task(engine.run())       # in the app's cleanup_ctx
    handle = engine.submit("req-1", prompt_ids, SamplingParams(max_tokens=16))
    async for output in handle.outputs():
        send(output.text_delta)                     # the last one has finish_reason
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from backends.engine_core.block_manager import KvEvent
from backends.engine_core.sequence import Sequence
from backends.engine_core.types import EngineLoad, EnginePhases
from backends.publisher import KvPublisher
from backends.worker.engine import LLMEngine, RequestOutput
from backends.worker.sampling import SamplingParams

log = logging.getLogger(__name__)


class RequestHandle:
    """A submitted request: its outputs as they are generated, its totals and timings.

    One consumer reads the outputs, with ``next_outputs()`` or ``outputs()``. Timings are
    ``time.monotonic()`` seconds, the clock the engine stamps sequences with.
    """

    __slots__ = ("_error", "_outputs", "_waiter", "arrival_s", "finish_reason", "finish_s",
                 "first_token_s", "num_cached_tokens", "num_output_tokens", "num_prompt_tokens",
                 "request_id", "seq", "stop_reason")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.request_id = seq.seq_id
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.arrival_s = seq.arrival_time_s
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._outputs: list[RequestOutput] = []
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def _deliver(self, output: RequestOutput, now_s: float) -> None:
        if output.is_first:
            self.first_token_s = now_s
        self.num_cached_tokens = output.num_cached_tokens
        self.num_output_tokens = output.num_output_tokens
        if output.finish_reason is not None:
            self.finish_reason, self.stop_reason = output.finish_reason, output.stop_reason
            self.finish_s = now_s
        self._outputs.append(output)
        self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_outputs(self) -> list[RequestOutput]:
        """The outputs delivered since the last call, waiting for at least one. Raises the
        engine's error if the request failed."""
        while not self._outputs:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        outputs, self._outputs = self._outputs, []
        return outputs

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Each output as it is generated; the last carries ``finish_reason``."""
        while True:
            for output in await self.next_outputs():
                yield output
                if output.finish_reason is not None:
                    return

    async def wait_finished(self) -> tuple[list[int], str]:
        """Consume every output; the whole output's token ids and text."""
        token_ids: list[int] = []
        text: list[str] = []
        async for output in self.outputs():
            token_ids.extend(output.new_token_ids)
            text.append(output.text_delta)
        return token_ids, "".join(text)

    def phases(self) -> EnginePhases:
        return EnginePhases(
            arrival_s=self.arrival_s, scheduled_s=self.seq.first_scheduled_time_s,
            first_token_s=self.first_token_s, finish_s=self.finish_s,
            num_prompt_tokens=self.num_prompt_tokens, num_cached_tokens=self.num_cached_tokens,
            num_output_tokens=self.num_output_tokens, num_preemptions=self.seq.num_preemptions,
        )


@dataclass(slots=True)
class _StepResult:
    outputs: list[RequestOutput] = field(default_factory=list)
    failed: list[tuple[str, Exception]] = field(default_factory=list)
    events: list[KvEvent] = field(default_factory=list)


class AsyncEngine:
    """One PyTorch engine on the running event loop; see the module docstring."""

    def __init__(self, engine: LLMEngine, *, worker_id: str = "worker-0",
                 publisher: KvPublisher | None = None) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.publisher = publisher
        self._handles: dict[str, RequestHandle] = {}
        # (seq, params) to add or a request id to abort; deque appends and pops are atomic.
        self._ops: deque[tuple[Sequence, SamplingParams] | str] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=worker_id)
        self._has_work = False
        self._load = engine.load()

    # -- requests -----------------------------------------------------------------------

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               cache_salt: str | None = None) -> RequestHandle:
        """Queue a request; ValueError (with what to change) if the engine can never serve it
        or the id is in use."""
        if request_id in self._handles:
            raise ValueError(f"request id {request_id!r} is already queued or running")
        seq = self.engine.make_sequence(request_id, prompt_token_ids, params,
                                        cache_salt=cache_salt)
        handle = RequestHandle(seq)
        self._handles[request_id] = handle
        self._ops.append((seq, params))
        self._wakeup.set()
        return handle

    def abort(self, request_id: str) -> None:
        """The client went away: the request stops and frees its KV before the next step.
        A no-op for a finished or unknown request."""
        if self._handles.pop(request_id, None) is not None:
            self._ops.append(request_id)
            self._wakeup.set()

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Submit and stream the outputs; the request is aborted if the consumer stops early."""
        handle = self.submit(request_id, prompt_token_ids, params)
        try:
            async for output in handle.outputs():
                yield output
        finally:
            self.abort(request_id)

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        """Step while there is work, until cancelled (then the engine thread is let go)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._ops and not self._has_work:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                try:
                    result = await loop.run_in_executor(self._executor, self._step)
                except Exception as exc:
                    log.exception("worker %s: engine step failed; failing its requests",
                                  self.worker_id)
                    await loop.run_in_executor(self._executor, self._abort_all)
                    for handle in self._handles.values():
                        handle._fail(exc)
                    self._handles.clear()
                    continue
                self._dispatch(result)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _step(self) -> _StepResult:
        """In the engine thread: queued adds and aborts, in order, then one step."""
        engine = self.engine
        result = _StepResult()
        while self._ops:
            op = self._ops.popleft()
            if isinstance(op, str):
                engine.abort(op)
                continue
            try:
                engine.add_sequence(*op)
            except ValueError as exc:
                result.failed.append((op[0].seq_id, exc))
        if engine.has_work:
            result.outputs = engine.step()
        result.events = engine.drain_kv_events()
        self._load = engine.load()
        self._has_work = engine.has_work
        return result

    def _abort_all(self) -> None:
        for seq in [*self.engine.scheduler.waiting, *self.engine.scheduler.running]:
            self.engine.abort(seq.seq_id)
        self._ops.clear()
        self._load = self.engine.load()
        self._has_work = self.engine.has_work

    def _dispatch(self, result: _StepResult) -> None:
        now_s = time.monotonic()
        for request_id, error in result.failed:
            handle = self._handles.pop(request_id, None)
            if handle is not None:
                handle._fail(error)
        for output in result.outputs:
            handle = self._handles.get(output.request_id)
            if handle is None:
                continue  # aborted while the step ran
            if output.finish_reason is not None:
                del self._handles[output.request_id]
            handle._deliver(output, now_s)
        if self.publisher is not None:
            for event in result.events:
                self.publisher.record(event.kind, list(event.block_hashes))  # type: ignore[arg-type]

    # -- load, metrics ------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        return self.engine.num_steps

    @property
    def num_prompt_tokens_total(self) -> int:
        return self.engine.num_prompt_tokens_total

    @property
    def num_generation_tokens_total(self) -> int:
        return self.engine.num_generation_tokens_total

    @property
    def num_requests_finished(self) -> dict[str, int]:
        return self.engine.num_requests_finished

    def core_load(self) -> EngineLoad:
        """The engine's figures after its latest step (vLLM metric names on `EngineLoad`)."""
        return self._load

    def load(self) -> dict[str, float | int]:
        """The heartbeat's load document, as `SimWorker.load` writes it."""
        load = self._load
        return {
            "num_running": load.num_running,
            "num_waiting": load.num_waiting + len(self._ops),  # + not yet handed over
            "kv_usage": round(load.kv_usage, 4),
            "num_free_kv_blocks": load.num_free_kv_blocks,
            "num_prefix_kv_blocks": load.num_prefix_kv_blocks,
            "num_queued_prefill_tokens": load.num_queued_prefill_tokens,
            "num_preemptions": load.num_preemptions,
        }

    def resident_hashes(self) -> list[int]:
        # list(dict) of int keys runs in C under the GIL: safe while the engine thread steps.
        return self.engine.resident_hashes()

    async def embed(self, prompts: list[list[int]]) -> list[list[float]]:
        """``LLMEngine.embed`` between two steps, on the engine's thread (it raises its
        ValueError)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.engine.embed, prompts)

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix, between steps; False while requests hold KV."""
        loop = asyncio.get_running_loop()
        is_reset, events = await loop.run_in_executor(self._executor, self._reset_prefix_cache)
        self._dispatch(_StepResult(events=events))
        return is_reset

    def _reset_prefix_cache(self) -> tuple[bool, list[KvEvent]]:
        return self.engine.reset_prefix_cache(), self.engine.drain_kv_events()
