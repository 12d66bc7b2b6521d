"""Memory the gateway's heap holds free, given back to the system.

The gateway's per-prompt caches are bounded (the segment cache in bytes, the approximate
index in entries of bounded size), but they churn: with unique prompts every request frees
kilobyte-sized strings and allocates new ones. glibc's malloc keeps what is freed for reuse,
and fragmentation leaves more of it idle over time. A soak of unique prompts showed it: the
memory in use was flat while the free-but-held part grew by about 30 MB in five minutes.
Every ``interval_s`` the gateway calls ``malloc_trim(0)``, in a worker thread (ctypes drops
the GIL). That returns the free pages to the system, so RSS follows what is in use.

Without glibc (musl, macOS) there is no ``malloc_trim``, and the task does nothing.

Example::

    task = asyncio.create_task(trim_heap_forever(60.0))
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


MALLOC_TRIM = _malloc_trim()


class HeapTrimmer:
    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.num_trims = 0

    @property
    def is_supported(self) -> bool:
        return MALLOC_TRIM is not None

    async def trim(self) -> None:
        if MALLOC_TRIM is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, MALLOC_TRIM, 0)
        self.num_trims += 1

    async def run(self) -> None:
        """Trim every ``interval_s`` until cancelled."""
        if MALLOC_TRIM is None:
            log.info("no malloc_trim in this C library: the heap is not trimmed")
            return
        while True:
            await asyncio.sleep(self.interval_s)
            await self.trim()
