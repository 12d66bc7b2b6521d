"""Paged KV with prefix caching: allocation, reuse, LRU eviction, growth and KV events."""

from __future__ import annotations

import pytest

from backends.engine_core.block_manager import BlockManager, KvEvent
from backends.engine_core.sequence import Sequence

BLOCK = 4


def make(seq_id: str, prompt: list[int], salt: str | None = None) -> Sequence:
    return Sequence(seq_id, prompt, 8, 0.0, model="m", block_size=BLOCK, cache_salt=salt)


def compute_all(manager: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_computed_blocks(seq)


def test_allocate_and_free() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make("a", list(range(10)))
    assert manager.can_allocate(seq)
    manager.allocate(seq)
    assert len(seq.block_table) == 3
    assert (manager.num_free_blocks, manager.usage) == (5, 3 / 8)
    manager.deallocate(seq)
    assert (manager.num_free_blocks, manager.usage, seq.block_table) == (8, 0.0, [])
    assert manager.num_cached_blocks == 0  # nothing was computed, so nothing was cached
    assert manager.drain_events() == []


@pytest.mark.parametrize(
    ("first", "second", "cached_tokens"),
    [
        pytest.param(list(range(12)), [*range(12), 50, 51, 52, 53], 12, id="full-prefix-hit"),
        pytest.param(list(range(12)), list(range(12)), 8, id="identical-keeps-one-block-to-do"),
        pytest.param(list(range(12)), [*range(6), 99, *range(7, 12)], 4, id="differs-in-block-1"),
        pytest.param(list(range(12)), [99, *range(1, 12)], 0, id="differs-in-block-0"),
        pytest.param(list(range(6)), list(range(12)), 4, id="only-full-blocks-are-cached"),
    ],
)
def test_prefix_reuse(first: list[int], second: list[int], cached_tokens: int) -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    a, b = make("a", first), make("b", second)
    manager.allocate(a)
    compute_all(manager, a)
    manager.allocate(b)
    assert b.num_cached_tokens == b.num_computed_tokens == cached_tokens
    assert b.block_table[: cached_tokens // BLOCK] == a.block_table[: cached_tokens // BLOCK]
    assert manager.prefix_cache_queries_tokens == len(first) + len(second)
    assert manager.prefix_cache_hits_tokens == cached_tokens


def test_cache_salt_isolates() -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    a, b = make("a", list(range(12)), salt="t1"), make("b", list(range(16)), salt="t2")
    manager.allocate(a)
    compute_all(manager, a)
    manager.allocate(b)
    assert b.num_cached_tokens == 0


def test_shared_blocks_are_ref_counted() -> None:
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    a, b = make("a", list(range(12))), make("b", list(range(16)))
    manager.allocate(a)
    compute_all(manager, a)
    manager.allocate(b)
    assert manager.num_used_blocks == 4  # a's 3 blocks, shared, plus b's 4th
    manager.deallocate(a)
    assert manager.num_used_blocks == 4
    compute_all(manager, b)
    manager.deallocate(b)
    assert (manager.num_used_blocks, manager.num_cached_blocks) == (0, 4)


def test_lru_eviction_order_and_events() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    a = Sequence("a", [1, 2, 3, 4], 1, 0.0, model="m", block_size=2)
    b = Sequence("b", [5, 6, 7, 8], 1, 0.0, model="m", block_size=2)
    for seq in (a, b):
        manager.allocate(seq)
        compute_all(manager, seq)
        manager.deallocate(seq)  # tail first: the LRU is now a1, a0, b1, b0
    a0, a1 = a.block_hashes
    b0, b1 = b.block_hashes
    c = Sequence("c", list(range(20, 26)), 1, 0.0, model="m", block_size=2)
    assert manager.can_allocate(c)
    manager.allocate(c)
    assert manager.drain_events() == [
        KvEvent("stored", (a0, a1), None),
        KvEvent("stored", (b0, b1), None),
        KvEvent("removed", (a1, a0, b1)),
    ]
    assert manager.num_cached_blocks == 1
    d = Sequence("d", [5, 6, 9, 9, 9], 1, 0.0, model="m", block_size=2)
    manager.deallocate(c)
    manager.allocate(d)
    assert d.num_cached_tokens == 2  # b's head block outlived its tail


def test_plain_free_blocks_go_before_cached_ones() -> None:
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    a = make("a", list(range(8)))
    manager.allocate(a)
    compute_all(manager, a)
    manager.deallocate(a)
    manager.allocate(make("b", list(range(100, 108))))
    assert manager.num_cached_blocks == 2
    assert [e.kind for e in manager.drain_events()] == ["stored"]


def test_hit_revives_a_free_cached_block() -> None:
    manager = BlockManager(num_blocks=3, block_size=BLOCK)
    a = make("a", list(range(8)))
    manager.allocate(a)
    compute_all(manager, a)
    a_blocks = list(a.block_table)
    manager.deallocate(a)
    b = make("b", [*range(4), 7, 7, 7])  # hits a's first block, needs one fresh
    manager.allocate(b)
    assert (b.num_cached_tokens, b.block_table[0]) == (4, a_blocks[0])
    assert manager.num_free_blocks == 1
    c = make("c", [9, 9])
    manager.allocate(c)  # evicts from the LRU, which now holds only a's tail block
    assert manager.drain_events()[-1] == KvEvent("removed", (a.block_hashes[1],))


def test_chunked_compute_stores_blocks_as_they_fill() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    seq = make("a", list(range(14)))
    manager.allocate(seq)
    events = []
    for computed in (3, 9, 14):
        seq.num_computed_tokens = computed
        manager.cache_computed_blocks(seq)
        events += manager.drain_events()
    h = seq.block_hashes
    assert events == [KvEvent("stored", (h[0], h[1]), None), KvEvent("stored", (h[2],), h[1])]


def test_concurrent_duplicate_prefix_stays_plain() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    a, b = make("a", list(range(9))), make("b", list(range(9)))
    manager.allocate(a)
    manager.allocate(b)  # nothing computed yet: no hit
    compute_all(manager, a)
    compute_all(manager, b)
    assert len(manager.drain_events()) == 1
    manager.deallocate(b)
    manager.deallocate(a)
    assert manager.num_cached_blocks == 2


def test_watermark_holds_back_blocks_at_admission() -> None:
    manager = BlockManager(num_blocks=10, block_size=BLOCK, watermark_blocks=2)
    assert manager.can_allocate(make("fits", list(range(32))))
    assert not manager.can_allocate(make("eats-watermark", list(range(33))))


def test_append_grows_one_block_at_a_time() -> None:
    manager = BlockManager(num_blocks=3, block_size=BLOCK)
    seq = make("a", list(range(8)))
    manager.allocate(seq)
    seq.num_computed_tokens, seq.num_output_tokens = 8, 1  # 9 tokens: a 3rd block
    assert manager.can_append(seq)
    manager.append_slot(seq)
    assert (len(seq.block_table), manager.num_free_blocks) == (3, 0)
    seq.num_output_tokens = 4  # 12 tokens: still room
    assert manager.can_append(seq)
    manager.append_slot(seq)
    assert len(seq.block_table) == 3
    seq.num_output_tokens = 5  # 13 tokens: a 4th block, none left
    assert not manager.can_append(seq)
    with pytest.raises(RuntimeError, match="no free KV block"):
        manager.append_slot(seq)


def test_reset_prefix_cache() -> None:
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    a = make("a", list(range(8)))
    manager.allocate(a)
    compute_all(manager, a)
    assert not manager.reset_prefix_cache()  # refused while a holds blocks
    manager.deallocate(a)
    assert manager.reset_prefix_cache()
    assert manager.num_cached_blocks == 0
    assert [e.kind for e in manager.drain_events()] == ["stored", "cleared"]
    assert manager.drain_events() == []


def test_prefix_blocks_count_cached_blocks_a_later_request_hit() -> None:
    manager = BlockManager(num_blocks=6, block_size=BLOCK)
    a = make("a", list(range(12)))  # three blocks, all stored
    manager.allocate(a)
    compute_all(manager, a)
    manager.deallocate(a)
    assert (manager.num_cached_blocks, manager.num_prefix_blocks) == (3, 0)  # stored, not reused
    b = make("b", [*range(8), 70, 71])  # hits a's first two blocks
    manager.allocate(b)
    assert manager.num_prefix_blocks == 2
    manager.deallocate(b)
    again = make("again", [*range(8), 80])  # a second hit on the same blocks counts once
    manager.allocate(again)
    manager.deallocate(again)
    assert manager.num_prefix_blocks == 2
    # four fresh blocks: 3 plain ones, then the LRU's oldest, a's never-reused third block;
    # a fifth takes a reused block and the count drops with it
    manager.allocate(make("c", list(range(100, 116))))
    assert (manager.num_cached_blocks, manager.num_prefix_blocks) == (2, 2)
    manager.allocate(make("d", [200, 201, 202, 203]))
    assert (manager.num_cached_blocks, manager.num_prefix_blocks) == (1, 1)


def test_reset_forgets_prefix_blocks() -> None:
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    for seq_id in ("a", "b"):
        seq = make(seq_id, list(range(9)))
        manager.allocate(seq)
        compute_all(manager, seq)
        manager.deallocate(seq)
    assert manager.num_prefix_blocks == 2
    assert manager.reset_prefix_cache()
    assert (manager.num_cached_blocks, manager.num_prefix_blocks) == (0, 0)


def test_usage_counts_a_shared_block_once_as_vllm_does() -> None:
    """vllm:kv_cache_usage_perc: blocks held by running requests; two running requests that
    share a cached prefix hold its blocks once, and a finished request's cached blocks are
    free (reusable) again."""
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    first = make("a", list(range(12)))  # 3 blocks
    manager.allocate(first)
    compute_all(manager, first)
    second = make("b", [*range(12), 40, 41, 42, 43])  # the 3 shared blocks + 1 of its own
    manager.allocate(second)
    assert manager.usage == 4 / 16  # not 7 / 16
    manager.deallocate(first)
    manager.deallocate(second)
    assert manager.usage == 0.0
    assert manager.num_cached_blocks == 3
