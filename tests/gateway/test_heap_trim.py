"""The heap trimmer gives freed memory back: after a burst of kilobyte strings is freed, a
trim lowers RSS (glibc only; elsewhere the trimmer says it cannot)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.observe.memory import MALLOC_TRIM, HeapTrimmer


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(MALLOC_TRIM is None, reason="this C library has no malloc_trim")
def test_a_trim_gives_freed_heap_back() -> None:
    held = [bytes(3000) + str(i).encode() for i in range(60_000)]  # ~180 MB of malloc blocks
    keep = held[::50]  # a few survivors pin the heap's top: plain free() cannot shrink it
    del held
    before = _rss_kib()
    trimmer = HeapTrimmer(interval_s=3600)
    asyncio.run(trimmer.trim())
    after = _rss_kib()
    assert trimmer.num_trims == 1 and keep
    assert before - after > 50_000, (before, after)  # tens of MB back to the system
