"""The shared core with real token ids: recorded outputs, output-block hashes, the token check
on a hit, and `complete_step` fed by an engine's sampler and stop checks."""

from __future__ import annotations

import pytest

from backends.engine_core.block_manager import BlockManager, KvEvent
from backends.engine_core.scheduler import Scheduler
from backends.engine_core.sequence import Sequence, SequenceStatus
from routing.prefix import token_block_hashes

BLOCK = 4


def make(seq_id: str, prompt: list[int], max_tokens: int = 8) -> Sequence:
    return Sequence(seq_id, prompt, max_tokens, 0.0, model="m", block_size=BLOCK,
                    cache_salt="t")


def compute_all(manager: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_computed_blocks(seq)


def test_append_token_records_ids_and_hashes_full_output_blocks() -> None:
    seq = make("a", [1, 2, 3, 4, 5, 6])
    for token_id in (7, 8, 9):
        seq.append_token(token_id)
    assert (seq.num_output_tokens, seq.token_ids, seq.last_token_id) == (
        3, [1, 2, 3, 4, 5, 6, 7, 8, 9], 9)
    assert seq.block_hashes == tuple(token_block_hashes(seq.token_ids, BLOCK, "m", "t"))
    assert seq.block_token_ids(1) == (5, 6, 7, 8)
    assert seq.block_token_ids(2) == (9,)


def test_append_token_refuses_a_sequence_that_only_counted() -> None:
    seq = make("a", [1, 2])
    seq.num_output_tokens = 1  # as the simulator does
    with pytest.raises(RuntimeError, match="counted output tokens without their ids"):
        seq.append_token(5)


@pytest.mark.parametrize("check_tokens", [pytest.param(True, id="checked"),
                                          pytest.param(False, id="unchecked")])
def test_token_check_refuses_a_hash_collision(monkeypatch: pytest.MonkeyPatch,
                                              check_tokens: bool) -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK, check_tokens=check_tokens)
    a = make("a", list(range(12)))
    manager.allocate(a)
    compute_all(manager, a)
    b = make("b", [*range(4), 90, 91, 92, 93, 94, 95])
    # Force a 64-bit collision: b's second block claims a's second block's hash.
    monkeypatch.setattr(b, "block_hashes", (a.block_hashes[0], a.block_hashes[1]))
    manager.allocate(b)
    if check_tokens:
        assert b.num_cached_tokens == 4  # the first block matches, the collision is refused
        assert b.block_table[1] != a.block_table[1]
        assert manager.num_token_check_misses == 1
    else:
        assert b.num_cached_tokens == 8  # hash equality alone: the wrong KV would be served
        assert manager.num_token_check_misses == 0


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK, check_tokens=True)
    a = make("a", [1, 2, 3, 4, 5, 6])
    manager.allocate(a)
    compute_all(manager, a)
    for token_id in (7, 8, 9, 10):
        manager.append_slot(a)
        a.append_token(token_id)
        a.num_computed_tokens = a.num_tokens - 1  # the newest token's KV is not computed yet
        manager.cache_computed_blocks(a)
    stored = [h for event in manager.drain_events() for h in event.block_hashes]
    assert stored == list(a.block_hashes[:2])  # block 2 (9, 10) is not full yet
    manager.deallocate(a)
    turn_2 = make("b", [*a.token_ids, 11, 12, 13])
    manager.allocate(turn_2)
    assert turn_2.num_cached_tokens == 8  # the prompt block and the first answer block


def run_with_tokens(scheduler: Scheduler, next_token: dict[str, int],
                    stop_at: dict[str, int] | None = None) -> list[tuple[str, int, str | None]]:
    """Step until idle, each sequence emitting ``next_token[seq_id]`` then +1, +2, ...;
    ``stop_at[seq_id]`` is the token the engine reports as a stop."""
    emitted = []
    while scheduler.has_work:
        plan = scheduler.schedule(0.0)
        ids = scheduler.emitting_ids(plan)
        sampled = {seq_id: next_token[seq_id] for seq_id in ids}
        reasons = {seq_id: "stop" for seq_id in ids
                   if stop_at and stop_at.get(seq_id) == sampled[seq_id]}
        for token in scheduler.complete_step(plan, 1.0, sampled, reasons).tokens:
            emitted.append((token.seq_id, token.token_id or 0, token.finish_reason))
            next_token[token.seq_id] += 1
    return emitted


def test_complete_step_records_sampled_ids_and_engine_stops() -> None:
    scheduler = Scheduler(BlockManager(32, BLOCK, check_tokens=True), max_batch=4,
                          max_num_batched_tokens=5, max_context_tokens=64)
    a, b = make("a", list(range(7)), max_tokens=3), make("b", list(range(50, 53)), max_tokens=9)
    scheduler.add(a)
    scheduler.add(b)
    emitted = run_with_tokens(scheduler, {"a": 100, "b": 200}, stop_at={"b": 201})
    assert [e for e in emitted if e[0] == "a"] == [("a", 100, None), ("a", 101, None),
                                                     ("a", 102, "length")]
    assert [e for e in emitted if e[0] == "b"] == [("b", 200, None), ("b", 201, "stop")]
    assert a.output_token_ids == [100, 101, 102] and b.output_token_ids == [200, 201]
    assert (b.status, b.finish_reason) == (SequenceStatus.FINISHED, "stop")
    assert scheduler.block_manager.num_used_blocks == 0


def test_engine_stop_wins_over_length() -> None:
    scheduler = Scheduler(BlockManager(8, BLOCK), max_batch=1, max_num_batched_tokens=8,
                          max_context_tokens=64)
    scheduler.add(make("a", [1, 2], max_tokens=1))
    assert run_with_tokens(scheduler, {"a": 7}, stop_at={"a": 7}) == [("a", 7, "stop")]


def test_missing_sampled_token_is_an_error() -> None:
    scheduler = Scheduler(BlockManager(8, BLOCK), max_batch=1, max_num_batched_tokens=8,
                          max_context_tokens=64)
    scheduler.add(make("a", [1, 2]))
    plan = scheduler.schedule(0.0)
    assert scheduler.emitting_ids(plan) == ["a"]
    with pytest.raises(ValueError, match="sampled_token_ids has none for it"):
        scheduler.complete_step(plan, 1.0, {})


def test_preempted_sequence_keeps_its_outputs_and_rehits_its_blocks() -> None:
    manager = BlockManager(6, BLOCK, check_tokens=True)
    scheduler = Scheduler(manager, max_batch=4, max_num_batched_tokens=64,
                          max_context_tokens=64)
    a, b = make("a", list(range(8))), make("b", list(range(100, 108)))
    scheduler.add(a)
    scheduler.add(b)
    next_token = {"a": 1000, "b": 2000}
    while not scheduler.num_preemptions:
        plan = scheduler.schedule(0.0)
        sampled = {seq_id: next_token[seq_id] for seq_id in scheduler.emitting_ids(plan)}
        for token in scheduler.complete_step(plan, 1.0, sampled).tokens:
            next_token[token.seq_id] += 1
    assert b.status is SequenceStatus.PREEMPTED and b.output_token_ids
    outputs_before = list(b.output_token_ids)
    run_with_tokens(scheduler, next_token)
    assert b.output_token_ids[: len(outputs_before)] == outputs_before
    assert b.output_token_ids == list(range(2000, 2008))
    assert b.num_cached_tokens > 0  # re-admitted onto its own cached blocks
    assert manager.num_used_blocks == 0
    kinds = {event.kind for event in manager.drain_events()}
    assert kinds <= {"stored", "removed"}


def test_kv_event_parent_chains_through_output_blocks() -> None:
    manager = BlockManager(8, BLOCK, check_tokens=True)
    seq = make("a", [1, 2, 3, 4])
    manager.allocate(seq)
    compute_all(manager, seq)
    for token_id in (5, 6, 7, 8):
        manager.append_slot(seq)
        seq.append_token(token_id)
    compute_all(manager, seq)
    assert manager.drain_events() == [
        KvEvent("stored", (seq.block_hashes[0],), None),
        KvEvent("stored", (seq.block_hashes[1],), seq.block_hashes[0]),
    ]
