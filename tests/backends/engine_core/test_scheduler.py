"""Continuous batching: token budget, batch limit, KV-limited admission, preemption, aborts."""

from __future__ import annotations

import pytest

from backends.engine_core.block_manager import BlockManager
from backends.engine_core.scheduler import EmittedToken, Scheduler, StepPlan
from backends.engine_core.sequence import Sequence, SequenceStatus

BLOCK = 4


def make_scheduler(num_blocks: int = 64, max_batch: int = 8, budget: int = 64,
                   max_context: int = 256, watermark: int = 0) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BLOCK, watermark), max_batch=max_batch,
                     max_num_batched_tokens=budget, max_context_tokens=max_context)


def make(seq_id: str, num_prompt: int, max_tokens: int, first_token: int = 0,
         stop: int | None = None) -> Sequence:
    prompt = list(range(first_token, first_token + num_prompt))
    return Sequence(seq_id, prompt, max_tokens, 0.0, model="m", block_size=BLOCK,
                    stop_after_tokens=stop)


def run(scheduler: Scheduler, max_steps: int = 1000) -> tuple[list[StepPlan],
                                                              list[EmittedToken]]:
    """Step until idle; step k ends at now = k + 1 (unit steps)."""
    plans: list[StepPlan] = []
    tokens: list[EmittedToken] = []
    for step in range(max_steps):
        if not scheduler.has_work:
            break
        plan = scheduler.schedule(float(step))
        plans.append(plan)
        tokens += scheduler.complete_step(plan, float(step + 1)).tokens
    assert not scheduler.has_work
    return plans, tokens


@pytest.mark.parametrize(
    ("budget", "prompts", "expected"),
    [
        pytest.param(8, [20], [(8, 0), (8, 0), (4, 0), (0, 1)], id="one-prompt-in-chunks"),
        pytest.param(8, [5, 6], [(8, 0), (3, 1), (0, 1)], id="decode-counts-first"),
        pytest.param(3, [2, 2, 2], [(3, 0), (2, 1), (1, 1), (0, 1)], id="tight-budget"),
    ],
)
def test_chunked_prefill_respects_the_token_budget(
    budget: int, prompts: list[int], expected: list[tuple[int, int]]
) -> None:
    scheduler = make_scheduler(budget=budget)
    for index, num_prompt in enumerate(prompts):
        scheduler.add(make(f"s{index}", num_prompt, 2, first_token=100 * index))
    plans, _ = run(scheduler)
    assert [(p.num_prefill_tokens, p.num_decode_seqs) for p in plans][: len(expected)] == expected
    assert all(p.num_prefill_tokens + p.num_decode_seqs <= budget for p in plans)


def test_max_batch_is_respected() -> None:
    scheduler = make_scheduler(max_batch=2)
    for index, max_tokens in enumerate([3, 6, 2]):
        scheduler.add(make(f"s{index}", 4, max_tokens, first_token=100 * index))
    running_counts = []
    while scheduler.has_work:
        plan = scheduler.schedule(0.0)
        running_counts.append(len(scheduler.running))
        scheduler.complete_step(plan, 0.0)
    assert max(running_counts) == 2
    assert running_counts[:4] == [2, 2, 2, 2]  # s2 waits for s0's 3 tokens


def test_kv_capacity_limits_concurrency() -> None:
    scheduler = make_scheduler(num_blocks=8)  # 12-token prompts: 3 blocks now, 4 at the end
    for index in range(3):
        scheduler.add(make(f"s{index}", 12, 4, first_token=100 * index))
    first_plan = scheduler.schedule(0.0)
    assert [chunk.seq_id for chunk in first_plan.prefills] == ["s0", "s1"]
    assert [seq.seq_id for seq in scheduler.waiting] == ["s2"]
    scheduler.complete_step(first_plan, 1.0)
    _, tokens = run(scheduler)
    finished = {t.seq_id: t for t in tokens if t.finish_reason}
    assert set(finished) == {"s0", "s1", "s2"}
    assert scheduler.num_preemptions == 0


def test_newest_is_preempted_when_decode_runs_out_and_later_completes() -> None:
    scheduler = make_scheduler(num_blocks=6)  # a and b each grow from 2 to 4 blocks
    a, b = make("a", 8, 8), make("b", 8, 8, first_token=100)
    scheduler.add(a)
    scheduler.add(b)
    plans, tokens = run(scheduler)
    preempted = [seq_id for plan in plans for seq_id in plan.preempted_ids]
    assert preempted == ["b"]
    assert (scheduler.num_preemptions, a.num_preemptions, b.num_preemptions) == (1, 0, 1)
    assert b.first_scheduled_time_s == 0.0  # kept from its first admission
    for seq in (a, b):
        emitted = [t for t in tokens if t.seq_id == seq.seq_id]
        assert [t.num_output_tokens for t in emitted] == list(range(1, 9))
        assert sum(t.is_first for t in emitted) == 1
        assert (seq.status, seq.finish_reason) == (SequenceStatus.FINISHED, "length")
    assert a.finish_time_s is not None and b.finish_time_s is not None
    assert a.finish_time_s < b.finish_time_s
    assert scheduler.block_manager.num_used_blocks == 0


def test_preempted_sequence_recomputes_prompt_and_outputs() -> None:
    scheduler = make_scheduler(num_blocks=6)
    a, b = make("a", 8, 8), make("b", 8, 8, first_token=100)
    scheduler.add(a)
    scheduler.add(b)
    while not scheduler.num_preemptions:
        scheduler.complete_step(scheduler.schedule(0.0), 0.0)
    assert scheduler.waiting[0] is b and b.status is SequenceStatus.PREEMPTED
    assert b.num_queued_prefill_tokens == b.num_tokens == 8 + b.num_output_tokens


@pytest.mark.parametrize(
    ("num_prompt", "max_tokens", "seq_id", "message"),
    [
        pytest.param(250, 10, "long", "exceeds this worker's max_context_tokens", id="too-long"),
        pytest.param(60, 10, "big", "needs 18 KV blocks.*16 usable", id="never-fits-kv"),
        pytest.param(4, 1, "dup", "already queued", id="duplicate-id"),
    ],
)
def test_add_rejects(num_prompt: int, max_tokens: int, seq_id: str, message: str) -> None:
    scheduler = make_scheduler(num_blocks=20, watermark=4)
    scheduler.add(make("dup", 4, 1))
    with pytest.raises(ValueError, match=message):
        scheduler.add(make(seq_id, num_prompt, max_tokens))


def test_stop_length_finishes_early() -> None:
    scheduler = make_scheduler()
    scheduler.add(make("s", 4, 10, stop=3))
    _, tokens = run(scheduler)
    assert [(t.num_output_tokens, t.finish_reason) for t in tokens] == [
        (1, None), (2, None), (3, "stop")]


def test_abort_frees_blocks_wherever_the_sequence_is() -> None:
    scheduler = make_scheduler(max_batch=1)
    scheduler.add(make("running", 10, 5))
    scheduler.add(make("waiting", 10, 5, first_token=100))
    plan = scheduler.schedule(0.0)
    assert scheduler.abort("waiting") and scheduler.abort("running")
    assert not scheduler.abort("running")
    assert scheduler.complete_step(plan, 1.0).tokens == ()  # aborted mid-step: skipped
    assert not scheduler.has_work
    assert scheduler.block_manager.num_used_blocks == 0


def test_same_inputs_give_the_same_plans() -> None:
    def plans() -> tuple[list[StepPlan], list[EmittedToken], int]:
        scheduler = make_scheduler(num_blocks=12, max_batch=4, budget=10)
        for index in range(6):
            scheduler.add(make(f"s{index}", 5 + 3 * index, 8 + index % 3, first_token=index % 2))
        return (*run(scheduler), scheduler.num_preemptions)

    first = plans()
    assert first[2] > 0  # a workload busy enough to preempt
    assert first == plans()
