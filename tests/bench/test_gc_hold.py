"""``bench.common.gc_hold``: no cyclic collection while a drive runs, and the cycles it left
collected when it ends."""

from __future__ import annotations

import gc
import weakref

from bench.common.gc_hold import held_collections


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_cycles_made_inside_wait_for_the_exit_and_the_collector_comes_back() -> None:
    assert gc.isenabled()
    with held_collections():
        assert not gc.isenabled()
        made = weakref.ref(Node())
        for _ in range(100_000):  # far past generation 0's threshold
            Node()
        assert made() is not None  # nothing collected it inside
    assert made() is None
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with held_collections():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
