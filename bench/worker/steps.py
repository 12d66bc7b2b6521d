"""Timing the engine's steps: what each step ran (from the scheduler's plan) and how long.

`StepClock` sits between `LLMEngine` and its `ModelRunner` (the engine calls ``runner.run``
once per step), so it sees each step's `StepPlan`; `StepClock.step` times the whole
``engine.step()`` (schedule, forward pass, sampling, stop checks) on the wall clock, with the
device synchronised on both sides.

Example::

    clock = StepClock(engine)
    while engine.has_work:
        outputs, sample = clock.step()
        sample.num_decode_seqs, sample.seconds
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch

from backends.engine_core.scheduler import Scheduler, StepPlan
from backends.worker.engine import LLMEngine, RequestOutput
from backends.worker.runner import ModelRunner, StepLogits


@dataclass(frozen=True, slots=True)
class StepSample:
    """One timed step, in the terms of the simulator's latency model."""

    num_prefill_tokens: int
    num_decode_seqs: int
    num_kv_tokens: int
    seconds: float

    @property
    def is_pure_decode(self) -> bool:
        return self.num_prefill_tokens == 0 and self.num_decode_seqs > 0

    @property
    def is_pure_prefill(self) -> bool:
        return self.num_prefill_tokens > 0 and self.num_decode_seqs == 0

    def to_json(self) -> dict[str, float]:
        return asdict(self)


class StepClock:
    """Wraps ``engine.runner`` to record each step's plan; see the module docstring."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self._runner: ModelRunner = engine.runner
        self._plan: StepPlan | None = None
        engine.runner = self  # type: ignore[assignment]  # the runner seam: run(plan, scheduler)

    def run(self, plan: StepPlan, scheduler: Scheduler) -> StepLogits:
        self._plan = plan
        return self._runner.run(plan, scheduler)

    def step(self) -> tuple[list[RequestOutput], StepSample | None]:
        """One engine step and its sample (None when the step ran nothing)."""
        self._plan = None
        _synchronize(self._engine.device)
        start = time.perf_counter()
        outputs = self._engine.step()
        _synchronize(self._engine.device)
        seconds = time.perf_counter() - start
        plan = self._plan
        if plan is None:
            return outputs, None
        return outputs, StepSample(plan.num_prefill_tokens, plan.num_decode_seqs,
                                   plan.num_kv_tokens_attended, seconds)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(count: int, num_tokens: int, *, vocab_size: int, seed: int) -> list[list[int]]:
    """Distinct random prompts (no shared first block, so no prefix-cache hits), avoiding the
    low ids where special tokens live."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab_size) for _ in range(num_tokens)] for _ in range(count)]
