"""Timeouts for many concurrent waits on one event-loop timer.

``asyncio.timeout`` arms and cancels a ``TimerHandle`` per use, about 5 µs on a 2-core VM under
uvloop: on the gateway's hot path, where every request waits for its engine under a timeout
that almost never fires, that is more than a routing decision costs. ``Deadlines`` keeps the
waits of each length in arrival order (so in deadline order) and arms one timer, at the
earliest deadline of all; a wait that ends in time costs a dict insert and delete.

The semantics are ``asyncio.timeout``'s: when a wait's time is up its task is cancelled, and
the ``with`` block turns that cancellation into ``TimeoutError``; a cancellation from
elsewhere (the client left) stays a ``CancelledError``.

Example::

    deadlines = Deadlines()
    with deadlines.limit(30.0):   # in a task; raises TimeoutError after 30 s
        await response.wait_head()
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadlines:
    """The timed waits of one event loop, grouped by their length (few distinct lengths)."""

    __slots__ = ("_armed_at_s", "_groups", "_loop", "_timer")

    def __init__(self) -> None:
        # Per wait length: the waits in arrival order, so their deadlines ascend.
        self._groups: dict[float, dict[Limit, None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def limit(self, timeout_s: float) -> Limit:
        """A ``with`` block that raises ``TimeoutError`` once ``timeout_s`` has passed."""
        return Limit(self, timeout_s)

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    def _add(self, limit: Limit, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        group = self._groups.get(limit.timeout_s)
        if group is None:
            group = self._groups[limit.timeout_s] = {}
        was_empty = not group
        group[limit] = None
        if self._timer is None or (was_empty and limit.deadline_s < self._armed_at_s):
            self._arm(limit.deadline_s)

    def _remove(self, limit: Limit) -> None:
        group = self._groups.get(limit.timeout_s)
        if group is not None:
            group.pop(limit, None)

    def _arm(self, at_s: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at_s = at_s
        self._timer = self._loop.call_at(at_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        assert self._loop is not None
        now_s = self._loop.time()
        earliest_s: float | None = None
        for group in self._groups.values():
            while group:
                limit = next(iter(group))
                if limit.deadline_s > now_s:
                    if earliest_s is None or limit.deadline_s < earliest_s:
                        earliest_s = limit.deadline_s
                    break
                del group[limit]
                limit.expire()
        if earliest_s is not None:
            self._arm(earliest_s)


class Limit:
    """One timed wait (``Deadlines.limit``); used once."""

    __slots__ = ("_book", "_cancelling", "_task", "deadline_s", "expired", "timeout_s")

    def __init__(self, book: Deadlines, timeout_s: float) -> None:
        self._book = book
        self.timeout_s = timeout_s
        self.deadline_s = 0.0
        self.expired = False
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def __enter__(self) -> Limit:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.limit() must be used inside a task")
        loop = task.get_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self.deadline_s = loop.time() + self.timeout_s
        self._book._add(self, loop)
        return self

    def expire(self) -> None:
        self.expired = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if not self.expired:
            self._book._remove(self)
            return
        assert self._task is not None
        # The cancellation was ours (and no one else's) only if uncancelling it brings the
        # task back to where it was on entry: then it is this block's timeout.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
