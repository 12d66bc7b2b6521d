"""Hold Python's cyclic garbage collector while a load generator drives a run.

A load generator that measures latency in its own process pays its own pauses into every
figure: a full (generation 2) collection of a heap holding an earlier run's records stopped
``bench.replicas``'s driver for 45-60 ms, once in three of six second runs of an invocation, and
every request it had in flight then got that much added to its measured TTFT
(``docs/benchmarks/replicas.md``, "Where the hits' time goes"). Inside ``held_collections`` the
collector does not run: what is alive at entry is collected once and frozen out of later
collections, and reference counting still frees what the run drops. A drive is bounded in
requests and time, so what cycles it leaves wait until the exit, which collects them.

Example::

    with held_collections():
        records = uvloop.run(drive(...))
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_collections() -> Iterator[None]:
    """No cyclic collection inside; one before (then the survivors frozen) and one after."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        gc.collect()
