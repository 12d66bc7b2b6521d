"""The simulated engine's core: scheduler + block manager + latency, in virtual time.

Pure: no I/O, no clock, no randomness. The caller passes ``now_s`` and decides how time
passes, so the same core serves a live worker (sleeping ``step_time_s`` for real) and a
virtual-time fleet simulator (advancing a counter).

Intended loop of the async shell::

    core = SimEngineCore(WorkerProfile(model="llama-3-8b"))
    # on each request: core.add_request(request_id, prompt_token_ids, max_tokens, now_s=clock())
    # on client disconnect: core.abort(request_id)
    deadline_s = clock()
    while running:
        if not core.has_work:
            await new_request.wait(); deadline_s = clock(); continue
        plan, step_s = core.step(deadline_s)
        deadline_s += step_s                            # absolute deadlines: no drift
        await asyncio.sleep(max(0.0, deadline_s - clock()))
        outcome = core.finish_step(deadline_s)
        for token in outcome.tokens:                    # one token per sequence per step
            deliver(token.seq_id, token.num_output_tokens, token.finish_reason)
        publish(core.drain_kv_events())                 # KV events, in order
        # heartbeat / metrics read core.load() whenever they like

While ``has_work`` a plan is empty only in the step right after a preemption freed the
batch; it takes 0.0 s and the next step admits again, so the loop never spins.
"""

from __future__ import annotations

from collections.abc import Iterable

from backends.engine_core.block_manager import BlockManager, KvEvent
from backends.engine_core.scheduler import Scheduler, StepOutcome, StepPlan
from backends.engine_core.sequence import Sequence
from backends.engine_core.types import EngineLoad
from backends.sim.latency import step_time_s
from backends.sim.profile import WorkerProfile


class SimEngineCore:
    """One simulated GPU worker; see the module docstring for the loop that drives it.

    Example::

        core = SimEngineCore(WorkerProfile(model="m", num_kv_blocks=64, block_size=16))
        core.add_request("r1", list(range(100)), max_tokens=4, now_s=0.0)
        now_s = 0.0
        while core.has_work:
            plan, step_s = core.step(now_s)
            now_s += step_s
            outcome = core.finish_step(now_s)   # r1's first token after the first step
    """

    def __init__(self, profile: WorkerProfile) -> None:
        self.profile = profile
        self.block_manager = BlockManager(
            profile.num_kv_blocks, profile.block_size, profile.kv_watermark_blocks)
        self.scheduler = Scheduler(
            self.block_manager,
            max_batch=profile.max_batch,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            max_context_tokens=profile.max_context_tokens,
        )
        self._pending: StepPlan | None = None

    # -- requests -----------------------------------------------------------------------

    def add_request(
        self,
        seq_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        now_s: float,
        *,
        cache_salt: str | None = None,
        stop_after_tokens: int | None = None,
    ) -> Sequence:
        """Queue a request; ValueError (with what to change) if it can never be served."""
        seq = Sequence(seq_id, prompt_token_ids, max_tokens, now_s, model=self.profile.model,
                       block_size=self.profile.block_size, cache_salt=cache_salt,
                       stop_after_tokens=stop_after_tokens)
        self.scheduler.add(seq)
        return seq

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def abort(self, seq_id: str) -> bool:
        """Drop a request (client gone) and free its KV; False if it is not here."""
        return self.scheduler.abort(seq_id)

    def get(self, seq_id: str) -> Sequence | None:
        return self.scheduler.get(seq_id)

    # -- steps --------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self, now_s: float) -> tuple[StepPlan, float]:
        """Plan the step starting at ``now_s`` and how many seconds it runs."""
        if self._pending is not None:
            raise RuntimeError("finish_step() must follow each step() before the next one")
        plan = self.scheduler.schedule(now_s)
        self._pending = plan
        return plan, step_time_s(plan, self.profile)

    def finish_step(self, now_s: float) -> StepOutcome:
        """Apply the pending step, ending at ``now_s``: the tokens it produced."""
        if self._pending is None:
            raise RuntimeError("finish_step() called without a step() in progress")
        plan, self._pending = self._pending, None
        return self.scheduler.complete_step(plan, now_s)

    # -- load, metrics, KV events -------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    @property
    def num_queued_prefill_tokens(self) -> int:
        return self.scheduler.num_queued_prefill_tokens

    @property
    def prefix_cache_queries_tokens(self) -> int:
        return self.block_manager.prefix_cache_queries_tokens

    @property
    def prefix_cache_hits_tokens(self) -> int:
        return self.block_manager.prefix_cache_hits_tokens

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def load(self) -> EngineLoad:
        return EngineLoad(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_usage=self.kv_usage,
            num_free_kv_blocks=self.block_manager.num_free_blocks,
            num_cached_kv_blocks=self.block_manager.num_cached_blocks,
            num_prefix_kv_blocks=self.block_manager.num_prefix_blocks,
            num_queued_prefill_tokens=self.num_queued_prefill_tokens,
            prefix_cache_queries_tokens=self.prefix_cache_queries_tokens,
            prefix_cache_hits_tokens=self.prefix_cache_hits_tokens,
            num_preemptions=self.num_preemptions,
        )

    def drain_kv_events(self) -> list[KvEvent]:
        return self.block_manager.drain_events()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (one "cleared" event); False while requests hold KV."""
        return self.block_manager.reset_prefix_cache()
