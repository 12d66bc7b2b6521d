"""A min-heap with O(log n) push and pop, and O(1) removal by handle (lazy deletion).

Removed items stay in the list until they reach the top or until the dead outnumber the live
(then the heap is rebuilt, O(n), so amortised O(1) per removal): memory stays O(live items).
Equal keys come out in push order.

Example::

    heap: LazyHeap[str] = LazyHeap()
    a = heap.push(2.0, "a")
    heap.push(1.0, "b")
    heap.discard(a)
    heap.pop()          # (1.0, "b")
    len(heap)           # 0
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

T = TypeVar("T")
_MIN_COMPACT = 64


class LazyHeap(Generic[T]):
    """Items ordered by a float key; ``push`` returns a handle for ``discard``."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, T]] = []
        self._live: set[int] = set()
        self._next_handle = 0

    def __len__(self) -> int:
        return len(self._live)

    def push(self, key: float, item: T) -> int:
        handle = self._next_handle
        self._next_handle += 1
        heapq.heappush(self._items, (key, handle, item))
        self._live.add(handle)
        return handle

    def discard(self, handle: int) -> None:
        """Remove the item pushed under ``handle``; unknown or already removed is a no-op."""
        self._live.discard(handle)
        if len(self._items) > _MIN_COMPACT and len(self._items) > 2 * len(self._live):
            self._items = [item for item in self._items if item[1] in self._live]
            heapq.heapify(self._items)

    def peek(self) -> tuple[float, T] | None:
        """The smallest live (key, item) without removing it, or None when empty."""
        items, live = self._items, self._live
        while items and items[0][1] not in live:
            heapq.heappop(items)
        if not items:
            return None
        key, _, item = items[0]
        return key, item

    def pop(self) -> tuple[float, T] | None:
        """Remove and return the smallest live (key, item), or None when empty."""
        top = self.peek()
        if top is not None:
            self._live.discard(heapq.heappop(self._items)[1])
        return top
